"""The pod sync loop of one Node: list + watch the Pods bound to it and hand each to its PodWorker."""

import asyncio
import logging

from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from e2e.kubelet.apierrors import UNREACHABLE
from e2e.kubelet.pod_worker import PodWorker
from e2e.kubelet.runtime import NodeRuntime

log = logging.getLogger(__name__)


class _PodWatch(watch.Watch):  # type: ignore[misc]
    """kubernetes-asyncio's watch, decoding with the kubelet's own client. Its own makes a client for every
    watch, with an SSL context that loads the system's CA bundle: 250 Nodes renewing their watches together
    (every 300 s) spent 12 s of the kubelet's CPU at once, and Pods' 1 s liveness probes timed out."""

    def __init__(self, api: client.ApiClient) -> None:
        # Not super().__init__(), which makes that client; the same fields, as the library sets them.
        self._raw_return_type = None
        self._stop = False
        self._api_client = api
        self.resource_version = None
        self.resp = None

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

    async def run(self) -> None:
        """Forever: relist after errors and expired resource versions, so no Pod is missed."""
        core = self._runtime.core
        while True:
            try:
                listed = await core.list_pod_for_all_namespaces(field_selector=self._selector)
                self._relisted(listed.items)
                version = listed.metadata.resource_version
                while True:
                    async with _PodWatch(core.api_client) as stream:
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
