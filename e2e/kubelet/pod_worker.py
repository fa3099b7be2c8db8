"""One Pod on one Node, from admission to the object's removal: the kubelet's pod sync, for a single Pod.

Admission (address, GPUs) -> volumes -> init containers in order -> containers. On deletion: stop
the containers within the grace period, report their final status, then delete the Pod with grace 0;
the object goes away when the API server says so (finalizers may hold it), and only then are its
address and directories released.
"""

import asyncio
import contextlib
import logging
import shutil
from ipaddress import IPv4Address
from pathlib import Path

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from e2e.kubelet import dra
from e2e.kubelet.apierrors import API_ERRORS, describe
from e2e.kubelet.env import ContainerConfigError, PodFields
from e2e.kubelet.gpus import RESOURCE, InsufficientGpusError
from e2e.kubelet.runtime import NodeRuntime
from e2e.kubelet.status import PodState, now, pod_status
from e2e.kubelet.supervisor import ContainerSupervisor, PodEnvironment
from e2e.kubelet.volumes import VolumeError, materialize
from kube.backoff import Backoff
from kube.client import answer_of

log = logging.getLogger(__name__)
# Failures to configure a container that a later try may not meet (a Secret may appear, the API server return).
_RETRIED: tuple[type[BaseException], ...] = (ContainerConfigError, VolumeError, *API_ERRORS)

_TERMINAL = ("Succeeded", "Failed")


def gpu_request(container: client.V1Container) -> int:
    resources = container.resources
    if resources is None:
        return 0
    value = (resources.limits or {}).get(RESOURCE) or (resources.requests or {}).get(RESOURCE) or "0"
    return int(value)


class PodWorker:
    def __init__(self, runtime: NodeRuntime, pod: client.V1Pod) -> None:
        self._runtime = runtime
        self.pod = pod
        self.uid: str = pod.metadata.uid
        self.state = PodState(host_ip=runtime.host_ip)
        self._env: PodEnvironment | None = None
        self._supervisors: list[ContainerSupervisor] = []
        self._address: IPv4Address | None = None
        self._dirty = asyncio.Event()
        self._deleting = asyncio.Event()
        self._gone = asyncio.Event()
        self._last_sent: dict[str, object] | None = None
        self._written_version = 0  # the Pod's resourceVersion as the last status write left it
        self._status_written = asyncio.Lock()
        self._pod_dir = runtime.config.pods_dir / self.uid
        self.update(pod)

    @property
    def name(self) -> str:
        return f"{self.pod.metadata.namespace}/{self.pod.metadata.name}"

    def update(self, pod: client.V1Pod) -> None:
        """A newer version of the Pod object. When another client changed its readiness after this kubelet's
        last status write (the node lifecycle controller marks the Pods of a Node it lost NotReady), the status
        is sent again. A version older than that write is an event still on its way (a watch lags seconds
        behind on a busy API server), not a change, and sends nothing."""
        self.pod = pod
        if (
            self._last_sent is not None
            and int(pod.metadata.resource_version) > self._written_version
            and _readiness(pod) != _readiness_sent(self._last_sent)
        ):
            self._last_sent = None
            self._notify()
        if self._env is not None:
            self._env.pod = pod
        if pod.metadata.deletion_timestamp is not None:
            self._deleting.set()

    def sync(self) -> None:
        """The Pod changed in what makes the kubelet sync it (`sync.meaningful`): its containers' status is
        computed afresh, which runs the readiness probe of each running container not yet ready."""
        for supervisor in self._supervisors:
            supervisor.sync()

    def gone(self) -> None:
        """The Pod object no longer exists."""
        self._gone.set()
        self._deleting.set()

    def _notify(self) -> None:
        self._dirty.set()

    async def run(self) -> None:
        already_over = (self.pod.status and self.pod.status.phase) in _TERMINAL
        lifecycle = None if self._deleting.is_set() or already_over else asyncio.create_task(self._lifecycle())
        reporter = asyncio.create_task(self._report_status())
        try:
            await self._deleting.wait()
            # The stopped containers and the terminal phase go in the one write below, as a kubelet reports a
            # Pod it terminates (the reporter wrote the containers' stop first: one more Pod write per Pod).
            await self._cancel(reporter)
            grace = self._env.grace_seconds if self._env is not None else 0.0
            await self.stop(grace)
            await self._cancel(lifecycle)
            self._release_gpus()
            if not self._gone.is_set():
                await self._flush_status()
                await self._delete()
            await self._gone.wait()
        finally:
            self.kill()
            await self._cancel(lifecycle)
            await self._cancel(reporter)
            self._release_gpus()
            if self._address is not None:
                self._runtime.addresses.release(self._address)
            shutil.rmtree(self._pod_dir, ignore_errors=True)
            await self._runtime.objects.release(self.uid)

    def kill(self) -> None:
        """Kill every container at once (a lost node, a kubelet shutting down)."""
        for supervisor in self._supervisors:
            supervisor.kill()

    async def stop(self, grace_seconds: float) -> None:
        await asyncio.gather(*(s.stop(grace_seconds) for s in self._supervisors))

    @staticmethod
    async def _cancel(task: "asyncio.Task[None] | None") -> None:
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _release_gpus(self) -> None:
        self._runtime.gpus.release(self.uid)
        self.state.released = True
        self._notify()

    async def _fail(self, reason: str, message: str) -> None:
        self.state.failed_reason, self.state.failed_message = reason, message
        self._release_gpus()
        await self._runtime.events.record(self.pod, "Warning", reason, message)

    async def _lifecycle(self) -> None:
        """A kubelet bug or an input it cannot handle fails this Pod, with the reason; the kubelet goes on."""
        try:
            await self._run_pod()
        except Exception as error:
            log.exception("cannot run %s", self.name)
            self.kill()
            await self._fail("KubeletError", f"the loopback kubelet cannot run this Pod: {error!r}")

    async def _run_pod(self) -> None:
        pod, spec = self.pod, self.pod.spec
        self.state.start_time = now()
        # Extended resources of init containers are reused by the app containers, as the device manager does.
        wanted = max(
            [sum(gpu_request(c) for c in spec.containers)] + [gpu_request(c) for c in spec.init_containers or []]
        )
        try:
            uuids = self._runtime.gpus.allocate(self.uid, wanted) if wanted else []
        except InsufficientGpusError as error:
            await self._fail("UnexpectedAdmissionError", str(error))
            return
        self._address = self._runtime.addresses.host_ip if spec.host_network else self._runtime.addresses.allocate()
        env = PodEnvironment(pod, str(self._address), self._runtime.objects.fetch_for(self.uid))
        self._env = env
        self.state.pod_ip = str(self._address)
        offset = 0
        for container in spec.containers:
            env.gpus[container.name] = uuids[offset : offset + gpu_request(container)]
            offset += gpu_request(container)
        for container in spec.init_containers or []:
            env.gpus[container.name] = uuids[: gpu_request(container)]
        for container_name, devices in (await self._claimed_devices()).items():
            env.gpus[container_name] = env.gpus.get(container_name, []) + devices
        env.gpus = {name: held for name, held in env.gpus.items() if held}
        policy = spec.restart_policy or "Always"
        init = [
            ContainerSupervisor(
                self._runtime, env, c, restart_policy="Never" if policy == "Never" else "OnFailure", notify=self._notify
            )
            for c in spec.init_containers or []
        ]
        main = [
            ContainerSupervisor(self._runtime, env, c, restart_policy=policy, notify=self._notify)
            for c in spec.containers
        ]
        self._supervisors = init + main
        self.state.init = [s.status for s in init]
        self.state.containers = [s.status for s in main]
        self.state.initialized = not init  # as a kubelet reports a Pod without init containers from the start
        self._notify()
        env.volumes = await self._volumes()
        # Reported with the first container's start, as a kubelet reports the sandbox: a write of its own was one
        # more Pod write per Pod, for a state that lasts milliseconds here.
        self.state.sandbox_ready = True
        for supervisor in init:
            await supervisor.run()
            result = supervisor.status.terminated
            if result is None or result.exit_code != 0:
                code = result.exit_code if result else "nothing"
                await self._fail("InitContainerFailed", f"init container {supervisor.spec.name} exited with {code}")
                return
        if init:
            self.state.initialized = True
            self._notify()
        await asyncio.gather(*(s.run() for s in main))
        self._release_gpus()

    async def _claimed_devices(self) -> dict[str, list[str]]:
        """Container name -> the UUIDs of the GPUs its ResourceClaims were allocated on this Node (`dra.py`)."""
        if not self.pod.spec.resource_claims:
            return {}
        resource = client.ResourceV1Api(self._runtime.core.api_client)
        devices = await dra.allocated_devices(resource, lambda: self.pod, self._runtime.node)
        uuids = self._runtime.gpus.uuids
        return {name: [uuids[dra.device_index(d)] for d in held] for name, held in devices.items()}

    async def _volumes(self) -> dict[str, Path]:
        """Retry until every volume is in place (a Secret may appear later), reporting FailedMount."""
        assert self._env is not None
        backoff = Backoff(base=1.0, cap=30.0)
        while True:
            try:
                fields = PodFields(self.pod, self._env.pod_ip, self._runtime.host_ip)
                return await materialize(
                    self.pod, self._pod_dir, fields, self._env.fetch, self._runtime.service_account_token
                )
            except _RETRIED as error:
                message = describe(error) if isinstance(error, API_ERRORS) else str(error)
                await self._runtime.events.record(self.pod, "Warning", "FailedMount", message)
            await backoff.wait()

    async def _report_status(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            await self._flush_status()
            await asyncio.sleep(0.05)  # coalesce bursts of changes into one patch

    async def _flush_status(self) -> None:
        """Write the status as it is now. One write at a time (the reporter's and the final one before the
        Pod's deletion), each computed when its turn comes: a write computed earlier but answered later put a
        stopped Pod back from Succeeded to Running."""
        async with self._status_written:
            await self._write_status()

    async def _write_status(self) -> None:
        if self.state.start_time is None:
            return  # never run here (first seen ending or ended): its status is not ours to write
        body = pod_status(self.pod, self.state)
        if body == self._last_sent:
            return
        meta = self.pod.metadata
        try:
            written = await answer_of(
                self._runtime.core.patch_namespaced_pod_status(meta.name, meta.namespace, body, _preload_content=False)
            )
            self._last_sent = body
            self._written_version = int(written["metadata"]["resourceVersion"])
        except API_ERRORS as error:
            if isinstance(error, ApiException) and error.status in (404, 409):  # gone, or a new Pod of the name
                return
            log.warning("status of %s not patched (%s); retrying", self.name, describe(error))
            asyncio.get_running_loop().call_later(1.0, self._notify)

    async def _delete(self) -> None:
        meta = self.pod.metadata
        options = client.V1DeleteOptions(grace_period_seconds=0, preconditions=client.V1Preconditions(uid=self.uid))
        while not self._gone.is_set():
            try:
                await self._runtime.core.delete_namespaced_pod(meta.name, meta.namespace, body=options)
                return
            except API_ERRORS as error:
                if isinstance(error, ApiException) and error.status in (404, 409):
                    return
                log.warning("could not delete %s (%s); retrying", self.name, describe(error))
            await asyncio.sleep(1.0)


def _readiness(pod: client.V1Pod) -> str | None:
    conditions = (pod.status.conditions if pod.status else None) or []
    return next((c.status for c in conditions if c.type == "Ready"), None)


def _readiness_sent(body: dict[str, object]) -> str | None:
    status = body.get("status")
    conditions = status.get("conditions", []) if isinstance(status, dict) else []
    return next((c["status"] for c in conditions if c.get("type") == "Ready"), None)
