"""The pod sync loop of one Node: list + watch the Pods bound to it and hand each to its PodWorker."""

import asyncio
import json
import logging
from typing import Any

from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from e2e.kubelet.apierrors import UNREACHABLE
from e2e.kubelet.pod_worker import PodWorker
from e2e.kubelet.runtime import NodeRuntime

log = logging.getLogger(__name__)


class PodDecoder:
    """Pod events into kubernetes-asyncio's models, a Pod's spec decoded once while it stays the same.

    The spec is two thirds of a Pod's decoding time and barely changes after creation, while the Pod
    changes many times (its status, the controllers' annotations): with 2,000 Pods the watch events were
    half the kubelet's samples. Versions of a Pod with an equal spec share one decoded `V1PodSpec`
    (nothing in the kubelet changes it)."""

    def __init__(self, api: client.ApiClient) -> None:
        self._api = api
        self._specs: dict[str, tuple[Any, client.V1PodSpec]] = {}  # uid -> (the spec's JSON, decoded)

    def decode(self, obj: dict[str, Any]) -> client.V1Pod:
        uid = (obj.get("metadata") or {}).get("uid")
        spec = obj.get("spec")
        known = self._specs.get(uid) if uid else None
        if known is not None and known[0] == spec:
            rest = {key: value for key, value in obj.items() if key != "spec"}
            pod: client.V1Pod = self._api._ApiClient__deserialize(rest, "V1Pod")
            pod.spec = known[1]
            return pod
        pod = self._api._ApiClient__deserialize(obj, "V1Pod")
        if uid:
            self._specs[uid] = (spec, pod.spec)
        return pod

    def forget(self, uid: str) -> None:
        self._specs.pop(uid, None)


class _PodWatch(watch.Watch):  # type: ignore[misc]
    """kubernetes-asyncio's watch, decoding with the kubelet's own client. Its own makes a client for every
    watch, with an SSL context that loads the system's CA bundle: 250 Nodes renewing their watches together
    (every 300 s) spent 12 s of the kubelet's CPU at once, and Pods' 1 s liveness probes timed out. Pod
    events are decoded from one parse of their line by the `PodDecoder` (the library parses each line,
    writes the object back to JSON and parses that again); anything else (errors, bookmarks) as the
    library does."""

    def __init__(self, api: client.ApiClient, decoder: PodDecoder) -> None:
        # Not super().__init__(), which makes that client; the same fields, as the library sets them.
        self._raw_return_type = None
        self._stop = False
        self._api_client = api
        self._decoder = decoder
        self.resource_version = None
        self.resp = None

    def unmarshal_event(self, data: str | bytes, response_type: str | None) -> Any:
        try:
            event = json.loads(data)
        except ValueError:
            return super().unmarshal_event(data, response_type)
        obj = event.get("object") if isinstance(event, dict) else None
        if event.get("type") not in ("ADDED", "MODIFIED", "DELETED") or not isinstance(obj, dict):
            return super().unmarshal_event(data, response_type)
        pod = self._decoder.decode(obj)
        self.resource_version = pod.metadata.resource_version
        return {"type": event["type"], "object": pod, "raw_object": obj}

    async def close(self) -> None:
        """The response only: the client is the kubelet's, shared."""
        if self.resp is not None:
            self.resp.release()
            self.resp = None


class PodSync:
    def __init__(self, runtime: NodeRuntime) -> None:
        self._runtime = runtime
        self._selector = f"spec.nodeName={runtime.node}"
        self.workers: dict[str, PodWorker] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._decoder = PodDecoder(runtime.core.api_client)

    async def run(self) -> None:
        """Forever: relist after errors and expired resource versions, so no Pod is missed."""
        core = self._runtime.core
        while True:
            try:
                listed = await core.list_pod_for_all_namespaces(field_selector=self._selector)
                self._relisted(listed.items)
                version = listed.metadata.resource_version
                while True:
                    async with _PodWatch(core.api_client, self._decoder) as stream:
                        async for event in stream.stream(
                            core.list_pod_for_all_namespaces,
                            field_selector=self._selector,
                            resource_version=version,
                            timeout_seconds=300,
                            allow_watch_bookmarks=True,
                        ):
                            if event["type"] != "BOOKMARK":
                                self._handle(event["type"], event["object"])
                        version = stream.resource_version or version
            except ApiException as error:
                if error.status != 410:
                    log.warning("pod watch of %s failed: %s; relisting", self._runtime.node, error.reason)
                    await asyncio.sleep(1.0)
            except UNREACHABLE as error:
                log.warning("pod watch of %s broke: %r; relisting", self._runtime.node, error)
                await asyncio.sleep(1.0)

    def _relisted(self, pods: list[client.V1Pod]) -> None:
        present = {p.metadata.uid for p in pods}
        for uid, worker in self.workers.items():
            if uid not in present:
                worker.gone()
        for pod in pods:
            self._handle("MODIFIED", pod)

    def _handle(self, kind: str, pod: client.V1Pod) -> None:
        uid = pod.metadata.uid
        worker = self.workers.get(uid)
        if kind == "DELETED":
            self._decoder.forget(uid)
            if worker is not None:
                worker.gone()
            return
        if worker is not None:
            worker.update(pod)
            return
        worker = PodWorker(self._runtime, pod)
        self.workers[uid] = worker
        task = asyncio.create_task(worker.run(), name=f"pod {worker.name}")
        self._tasks[uid] = task
        task.add_done_callback(self._finished)

    def _finished(self, task: "asyncio.Task[None]") -> None:
        uid = next(u for u, t in self._tasks.items() if t is task)
        worker = self.workers.pop(uid, None)
        self._tasks.pop(uid, None)
        self._decoder.forget(uid)
        if not task.cancelled() and task.exception() is not None:
            log.error("worker of %s failed", worker.name if worker else uid, exc_info=task.exception())

    async def stop_all(self, grace_seconds: float) -> None:
        """Stop every container within `grace_seconds`, then drop the workers (kubelet shutdown)."""
        await asyncio.gather(*(w.stop(grace_seconds) for w in self.workers.values()))
        await self.abandon()

    async def abandon(self) -> None:
        """Kill every container at once and forget the Pods, reporting nothing (a lost node)."""
        for worker in self.workers.values():
            worker.kill()
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
