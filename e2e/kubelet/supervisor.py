"""One container's life: configure, start, probe, and restart per `restartPolicy` with a crash-loop back-off."""

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from kubernetes_asyncio import client

from e2e.kubelet import oci, probes
from e2e.kubelet.apierrors import API_ERRORS, describe
from e2e.kubelet.cdi import gpu_env
from e2e.kubelet.container import ContainerProcess
from e2e.kubelet.env import ContainerConfigError, Fetch, PodFields, expand, resolve_env
from e2e.kubelet.http_probe import HttpProbe
from e2e.kubelet.images import REPO_ROOT, command_line
from e2e.kubelet.logs import container_log
from e2e.kubelet.runtime import NodeRuntime
from e2e.kubelet.security import Security
from e2e.kubelet.simulation import SimulatedContainer
from e2e.kubelet.status import ContainerStatus, Terminated, now
from e2e.kubelet.volumes import Mount, VolumeError, container_mounts
from e2e.simulation.protocol import ContainerSpec
from e2e.simulation.protocol import Mount as SimulatedMount

log = logging.getLogger(__name__)
# Failures to configure a container that a later try may not meet (a Secret may appear, the API server return).
_RETRIED: tuple[type[BaseException], ...] = (ContainerConfigError, VolumeError, *API_ERRORS)

# A container that ran this long before exiting starts its back-off afresh (a real kubelet: 10 min).
_BACKOFF_RESET_SECONDS = 60.0


class Container(Protocol):
    """One run of a container, by either runtime: a local process (`container.py`) or OCI (`oci.py`)."""

    started_at: datetime.datetime

    @property
    def container_id(self) -> str: ...

    async def wait(self) -> int: ...

    async def stop(self, grace_seconds: float) -> int: ...

    def kill(self) -> None: ...

    async def exec(self, argv: list[str], *, env: dict[str, str], cwd: Path, limit: float) -> tuple[int, str]: ...


# Starts one run of a container, its output going to the given log file.
Starter = Callable[[Path], Awaitable[Container]]


class CrashLoopBackoff:
    """Container restarts (the kubelet's CrashLoopBackOff): the first at once, then `initial` seconds, doubling up
    to `maximum`. Unlike the API retries' back-off (kube.backoff.Backoff), it starts at zero and has no
    jitter: the delay is the one the CrashLoopBackOff message reports."""

    def __init__(self, initial: float, maximum: float) -> None:
        self._initial, self._maximum = initial, maximum
        self._next = 0.0

    def next(self) -> float:
        delay = self._next
        self._next = min(max(self._next * 2, self._initial), self._maximum)
        return delay

    def reset(self) -> None:
        self._next = 0.0


@dataclass
class PodEnvironment:
    """What the containers of one Pod share; `pod` is replaced as the kubelet sees new versions."""

    pod: client.V1Pod
    pod_ip: str
    fetch: Fetch  # the Pod's ConfigMaps and Secrets (`objects.py`)
    volumes: dict[str, Path] = field(default_factory=dict)
    gpus: dict[str, list[str]] = field(default_factory=dict)  # container name -> GPU UUIDs

    @property
    def grace_seconds(self) -> float:
        meta, spec = self.pod.metadata, self.pod.spec
        if meta.deletion_grace_period_seconds is not None:
            return float(meta.deletion_grace_period_seconds)
        return float(spec.termination_grace_period_seconds if spec.termination_grace_period_seconds is not None else 30)


class ContainerSupervisor:
    def __init__(
        self,
        runtime: NodeRuntime,
        pod: PodEnvironment,
        spec: client.V1Container,
        *,
        restart_policy: str,
        notify: Callable[[], None],
    ) -> None:
        self._runtime, self._pod, self.spec = runtime, pod, spec
        self._restart_policy = restart_policy
        self._notify = notify
        self.status = ContainerStatus(name=spec.name, image=spec.image or "")
        self._process: Container | None = None
        self._env: dict[str, str] = {}
        self._stopping = False
        self._stopped = asyncio.Event()
        self._readiness_due = asyncio.Event()

    async def _record(self, kind: str, reason: str, message: str) -> None:
        await self._runtime.events.record(self._pod.pod, kind, reason, message, self.spec.name)

    def _leave_terminated(self) -> None:
        """A new run begins: the finished run becomes `lastState`."""
        if self.status.terminated is not None:
            self.status.last_terminated, self.status.terminated = self.status.terminated, None

    def _set_waiting(self, reason: str, message: str | None = None) -> None:
        self._leave_terminated()
        self.status.state, self.status.reason, self.status.message = "waiting", reason, message
        self.status.ready = False
        self._notify()

    async def _configure(self) -> Starter | None:
        """How to start the container (None: a pause container). In its role's simulation process when
        the Node simulates its image, else its image from local container storage when it is there (the
        OCI runtime), else the image map's local command (the process runtime)."""
        pod = self._pod.pod
        fields = PodFields(pod, self._pod.pod_ip, self._runtime.host_ip)
        pod_env = await resolve_env(self.spec, fields, self._runtime.service_env(), self._pod.fetch)
        held = self._pod.gpus.get(self.spec.name, [])
        if held or self._runtime.gpu_mode == "dra":  # on a DRA Node only claims reach GPUs, `all` reaches none
            pod_env.update(gpu_env(held, cdi=self._runtime.gpus_through_cdi))
        mounts = container_mounts(self.spec, self._pod.volumes)
        image = self.spec.image or ""
        command = [expand(a, pod_env) for a in self.spec.command] if self.spec.command else None
        args = [expand(a, pod_env) for a in self.spec.args] if self.spec.args else None
        entry = self._runtime.images.lookup(image)
        security = Security.of(pod, self.spec)
        simulations = self._runtime.simulations
        role = simulations.role_of(image) if simulations is not None else None
        if simulations is not None and role is not None:
            simulated = ContainerSpec(
                id=f"{pod.metadata.uid}-{self.spec.name}-{self.status.restart_count}",
                role=role,
                namespace=pod.metadata.namespace,
                pod=pod.metadata.name,
                uid=pod.metadata.uid,
                container=self.spec.name,
                pod_ip=self._pod.pod_ip,
                command=command,
                args=args or (entry.cmd if entry is not None and not command else []),
                env={**self._runtime.images.image_env(entry, self._pod.pod_ip), **pod_env},
                mounts=[SimulatedMount(source=str(m.source), target=m.target, read_only=m.read_only) for m in mounts],
                log="",
            )
            return lambda log: simulations.run(simulated.model_copy(update={"log": str(log)}))
        if self._runtime.oci_owner is not None and await oci.image_exists(image):
            security.check_non_root(await oci.image_user(image))
            spec = oci.OciSpec(
                name=self._oci_name(self._runtime.oci_owner),
                image=image,
                command=command,
                args=args,
                env={**self._runtime.images.image_env(entry, self._pod.pod_ip), **pod_env},
                hostname=self._hostname(),
                mounts=mounts,
                working_dir=self.spec.working_dir,
                labels=self._oci_labels(self._runtime.oci_owner),
                security=security,
            )
            return lambda log: oci.OciContainer.start(spec, log)
        if entry is None:
            return None
        argv = command_line(entry, command, args)
        if not argv:
            raise ContainerConfigError(f"image {self.spec.image} has no command and the container gives none")
        env = {**self._runtime.images.base_env(entry, self._pod.pod_ip), "HOSTNAME": self._hostname(), **pod_env}
        self._env = env
        image_files = [Mount(Path(source), target, read_only=True) for target, source in entry.files.items()]
        mounted = [*image_files, *mounts]  # the image's own files, under the Pod's volumes
        read_only = security.read_only_root
        if any(REPO_ROOT.is_relative_to(volume.target) for volume in mounts):
            # This runtime's image is the checkout: a volume over one of its parents (an emptyDir at /tmp of a
            # checkout under /tmp) would hide the command itself, so the checkout is bound back over it, as
            # writable as the rest of the image.
            mounted.append(Mount(REPO_ROOT, str(REPO_ROOT), read_only=read_only))
        workdir = self.spec.working_dir or entry.working_dir
        hostname = self._hostname()
        return lambda log: ContainerProcess.start(
            argv,
            env=env,
            cwd=REPO_ROOT,
            workdir=workdir,
            hostname=hostname,
            mounts=mounted,
            log=log,
            read_only_root=read_only,
        )

    def _oci_name(self, owner: str) -> str:
        """Unique per run, and findable by the kubelet that owns it."""
        uid = self._pod.pod.metadata.uid
        return f"dualpods-{owner}-{uid[:8]}-{self.spec.name}-{self.status.restart_count}"

    def _oci_labels(self, owner: str) -> dict[str, str]:
        meta = self._pod.pod.metadata
        return {
            oci.OWNER_LABEL: owner,
            "io.kubernetes.pod.namespace": meta.namespace,
            "io.kubernetes.pod.name": meta.name,
            "io.kubernetes.pod.uid": meta.uid,
            "io.kubernetes.container.name": self.spec.name,
        }

    def _hostname(self) -> str:
        spec = self._pod.pod.spec
        name: str = spec.hostname or self._pod.pod.metadata.name
        return name[:63].rstrip("-.")

    def _should_restart(self, code: int) -> bool:
        if self._stopping:
            return False
        return self._restart_policy == "Always" or (self._restart_policy == "OnFailure" and code != 0)

    async def run(self) -> None:
        """Returns when the container is done for good (per restart policy), or is cancelled by `stop`."""
        backoff = CrashLoopBackoff(
            self._runtime.config.restart_backoff_initial_seconds, self._runtime.config.restart_backoff_max_seconds
        )
        while not self._stopping:
            try:
                start = await self._configure()
            except _RETRIED as error:
                message = describe(error) if isinstance(error, API_ERRORS) else str(error)
                self._set_waiting("CreateContainerConfigError", message)
                await self._record("Warning", "Failed", f"Error: {message}")
                await asyncio.sleep(max(backoff.next(), 1.0))
                continue
            if start is None:
                await self._run_pause()
                return
            code, ran = await self._run_once(start)
            if ran > _BACKOFF_RESET_SECONDS:
                backoff.reset()
            if not self._should_restart(code):
                return
            delay = backoff.next()
            if delay > 0:
                pod_name = self._pod.pod.metadata.name
                message = f"back-off {delay:g}s restarting failed container={self.spec.name} pod={pod_name}"
                self._set_waiting("CrashLoopBackOff", message)
                await self._record("Warning", "BackOff", "Back-off restarting failed container")
                await asyncio.sleep(delay)
            # Together, as a kubelet reports a restart: the count and the run it replaces.
            self._leave_terminated()
            self.status.restart_count += 1

    async def _run_pause(self) -> None:
        """An image the kubelet has no command for: nothing runs, the container stays Running."""
        self.status.state, self.status.started_at, self.status.started = "running", now(), True
        self.status.container_id = f"loopback://pause/{self._pod.pod.metadata.uid}/{self.spec.name}"
        self.status.ready = self.spec.readiness_probe is None
        self._notify()
        await self._record(
            "Normal", "Started", f"Started container {self.spec.name} (pause: image not in the image map)"
        )
        await self._stopped.wait()
        self._terminate(0, "Completed")

    def _terminate(self, code: int, reason: str) -> None:
        status = self.status
        status.terminated = Terminated(code, reason, status.started_at, now(), status.container_id)
        status.state, status.ready = "terminated", False
        self._notify()

    async def _run_once(self, start: Starter) -> tuple[int, float]:
        """Start the container and watch it and its probes; returns (exit code, seconds it ran)."""
        meta = self._pod.pod.metadata
        log = container_log(
            self._runtime.config.logs_dir,
            meta.namespace,
            meta.name,
            meta.uid,
            self.spec.name,
            self.status.restart_count,
        )
        process = await start(log)
        self._process = process
        status = self.status
        status.state, status.started_at, status.container_id = "running", process.started_at, process.container_id
        status.started = self.spec.startup_probe is None
        status.ready = status.started and self.spec.readiness_probe is None
        self._notify()
        await self._record("Normal", "Started", f"Started container {self.spec.name}")
        probing = asyncio.create_task(self._probe(process))
        try:
            code = await process.wait()
        finally:
            probing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probing
            self._process = None
        self._terminate(code, "Completed" if code == 0 else "Error")
        return code, (now() - process.started_at).total_seconds()

    def _target(self, process: Container) -> probes.ProbeTarget:
        ports = {p.name: p.container_port for p in self.spec.ports or [] if p.name}

        async def run_in_container(argv: list[str], limit: float) -> tuple[int, str]:
            return await process.exec(argv, env=self._env, cwd=REPO_ROOT, limit=limit)

        simulated = isinstance(process, SimulatedContainer)
        return probes.ProbeTarget(self._pod.pod_ip, ports, run_in_container, keep_alive=simulated)

    async def _probe(self, process: Container) -> None:
        """Startup probe first; then readiness (sets `ready`) and liveness (kills the container)."""
        target = self._target(process)
        if self.spec.startup_probe is not None:
            async for ok, why in probes.results(self.spec.startup_probe, target, process.started_at):
                if not ok:
                    await self._kill_unhealthy(process, "Startup", why)
                    return
                break
            self.status.started = True
            self.status.ready = self.spec.readiness_probe is None
            self._notify()
        await asyncio.gather(self._readiness(process, target), self._liveness(process, target))

    def sync(self) -> None:
        """The kubelet synced the Pod: a started, running container not known to be ready has its readiness
        probe run now rather than at its next period (the prober manager's UpdatePodStatus does so on every
        sync, so a Pod turns Ready right after the write that follows its readiness)."""
        if self.status.state == "running" and self.status.started and not self.status.ready:
            self._readiness_due.set()

    async def _readiness(self, process: Container, target: probes.ProbeTarget) -> None:
        if self.spec.readiness_probe is None:
            return
        async for ok, why in probes.results(self.spec.readiness_probe, target, process.started_at, self._readiness_due):
            self.status.ready = ok
            self._notify()
            if not ok:
                await self._record("Warning", "Unhealthy", f"Readiness probe failed: {why}")

    async def _liveness(self, process: Container, target: probes.ProbeTarget) -> None:
        if self.spec.liveness_probe is None:
            return
        async for ok, why in probes.results(self.spec.liveness_probe, target, process.started_at):
            if not ok:
                await self._kill_unhealthy(process, "Liveness", why)
                return

    async def _kill_unhealthy(self, process: Container, kind: str, why: str) -> None:
        await self._record("Warning", "Unhealthy", f"{kind} probe failed: {why}")
        await self._record(
            "Normal", "Killing", f"Container {self.spec.name} failed {kind.lower()} probe, will be restarted"
        )
        await process.stop(self._pod.grace_seconds)

    async def stop(self, grace_seconds: float) -> None:
        """Stop for good: SIGTERM, SIGKILL after the grace period; no restart follows."""
        self._stopping = True
        self._stopped.set()
        process = self._process
        if process is None:
            return
        await self._record("Normal", "Killing", f"Stopping container {self.spec.name}")
        deadline = asyncio.get_running_loop().time() + grace_seconds
        hook = self.spec.lifecycle.pre_stop if self.spec.lifecycle is not None else None
        if hook is not None:
            # A preStop handler is a probe that runs once, within the grace period.
            handler = client.V1Probe(
                _exec=hook._exec,
                http_get=hook.http_get,
                tcp_socket=hook.tcp_socket,
                timeout_seconds=max(1, int(grace_seconds)),
            )
            ok, why = await probes.check(handler, self._target(process), HttpProbe(keep_alive=False))
            if not ok:
                await self._record("Warning", "FailedPreStopHook", why)
        await process.stop(max(0.0, deadline - asyncio.get_running_loop().time()))

    def kill(self) -> None:
        """The node is lost: kill at once, report nothing."""
        self._stopping = True
        self._stopped.set()
        if self._process is not None:
            self._process.kill()
