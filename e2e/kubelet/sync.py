"""The pod sync of one Node: the Pods bound to it, kept by the controllers' informer, each handed to its PodWorker.

The informer (kube.informer) lists and watches `spec.nodeName=<node>` with the controllers' back-off
and relists after an expired resource version, telling every difference, so no Pod is missed.
"""

import asyncio
from typing import Any

from kubernetes_asyncio import client

from api.tasks import Background
from e2e.kubelet.models import from_json
from e2e.kubelet.pod_worker import PodWorker
from e2e.kubelet.runtime import NodeRuntime
from kube.informer import Informer, Obj


class PodDecoder:
    """Pods into kubernetes-asyncio's models, a Pod's spec decoded once while it stays the same.

    The spec is two thirds of a Pod's decoding time and barely changes after creation, while the Pod
    changes many times (its status, the controllers' annotations): with 2,000 Pods the watch events were
    half the kubelet's samples. Versions of a Pod with an equal spec share one decoded `V1PodSpec`
    (nothing in the kubelet changes it)."""

    def __init__(self) -> None:
        self._specs: dict[str, tuple[Any, client.V1PodSpec]] = {}  # uid -> (the spec's JSON, decoded)

    def decode(self, obj: Obj) -> client.V1Pod:
        uid = (obj.get("metadata") or {}).get("uid")
        spec = obj.get("spec")
        known = self._specs.get(uid) if uid else None
        if known is not None and known[0] == spec:
            pod: client.V1Pod = from_json({key: value for key, value in obj.items() if key != "spec"}, "V1Pod")
            pod.spec = known[1]
            return pod
        pod = from_json(obj, "V1Pod")
        if uid:
            self._specs[uid] = (spec, pod.spec)
        return pod

    def forget(self, uid: str) -> None:
        self._specs.pop(uid, None)


def meaningful(pod: Obj) -> tuple[object, ...]:
    """What the kubelet syncs a Pod on when it changes (its config source's "semantic difference"): its spec,
    labels, annotations and deletion; a status change alone does not."""
    meta = pod.get("metadata") or {}
    fields = ("labels", "annotations", "deletionTimestamp", "deletionGracePeriodSeconds")
    return (pod.get("spec"), *(meta.get(field) or None for field in fields))


def _uid(pod: Obj) -> str:
    return str(pod["metadata"]["uid"])


class PodSync:
    def __init__(self, runtime: NodeRuntime) -> None:
        self._runtime = runtime
        self.workers: dict[str, PodWorker] = {}
        self._working = Background()  # each worker's run, which forgets its Pod when it ends
        self._decoder = PodDecoder()
        self._pods = Informer(
            f"pods of {runtime.node}",
            runtime.watches.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={runtime.node}",
        )
        self._pods.subscribe(self._changed)

    async def run(self) -> None:
        """List, then watch, until cancelled."""
        await self._pods.run()

    def _changed(self, old: Obj | None, new: Obj | None) -> None:
        """A Pod appeared, changed or went away (a Pod of the same name but a new uid is another Pod)."""
        if old is not None and (new is None or _uid(old) != _uid(new)):
            self._gone(_uid(old))
        if new is not None:
            self._seen(self._decoder.decode(new))
            if old is not None and _uid(old) == _uid(new) and meaningful(old) != meaningful(new):
                self.workers[_uid(new)].sync()

    def _gone(self, uid: str) -> None:
        self._decoder.forget(uid)
        worker = self.workers.get(uid)
        if worker is not None:
            worker.gone()

    def _seen(self, pod: client.V1Pod) -> None:
        uid = pod.metadata.uid
        worker = self.workers.get(uid)
        if worker is not None:
            worker.update(pod)
            return
        worker = PodWorker(self._runtime, pod)
        self.workers[uid] = worker
        self._working.start(self._work(uid, worker), name=f"worker of pod {worker.name}")

    async def _work(self, uid: str, worker: PodWorker) -> None:
        """The worker's run; the Pod forgotten when it ends, however it ends (a failure is logged by `Background`)."""
        try:
            await worker.run()
        finally:
            self.workers.pop(uid, None)
            self._decoder.forget(uid)

    async def stop_all(self, grace_seconds: float) -> None:
        """Stop every container within `grace_seconds`, then drop the workers (kubelet shutdown)."""
        await asyncio.gather(*(w.stop(grace_seconds) for w in self.workers.values()))
        await self.abandon()

    async def abandon(self) -> None:
        """Kill every container at once and forget the Pods, reporting nothing (a lost node)."""
        for worker in self.workers.values():
            worker.kill()
        await self._working.stop()
