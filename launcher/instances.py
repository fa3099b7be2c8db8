"""The launcher's instance manager: a coordinator that holds the instances and runs the API's requests over the
parts of an instance's life.

- admission (`admission`): whether a create is admitted, and what it starts (a pure plan);
- the forker (`forking`): starts an admitted instance's server and supervises it (`monitor`: its first
  ready, its post-wake probe, its liveness, its sleep state); a simulation injects its own;
- the life cycle (`lifecycle`, `Instance.move`): every phase change is a declared transition that
  publishes its watch event and bumps the manager-wide revision;
- the client of each instance's own server (`instance_server`): sleep, wake; the post-wake check
  (`wake_verification`), and stopping (`stopping`).

All mutations happen on the event loop, and the checks that guard a create (duplicate IDs, ports) run
without an await between check and insert, so concurrent requests cannot race past them.
"""

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from api.launcher import (
    AllInstancesState,
    DeleteAllResult,
    ErrorReason,
    EventType,
    InstanceIds,
    InstanceState,
    StopReason,
    VllmConfig,
    WakeCheck,
    WakeCheckStatus,
)
from api.tasks import Background

from . import admission, gpu_memory, startup_phases, validation
from .admission import Admission, GpuFacts, Held, LauncherFacts
from .dialect import Dialect
from .engine_defaults import DEFAULT_CPU_KV_CACHE_BYTES
from .errors import Conflict, NotFound
from .events import EventLog
from .forking import Forked, Forker, ProcessForker
from .gpu_usage import gpu_memory_by_pid
from .gpus import GpuInventory
from .instance import Instance
from .instance_server import InstanceServers
from .lifecycle import Phase
from .liveness import LivenessPolicy
from .metrics import LauncherMetrics
from .monitor import Supervision
from .runtimes import Runtime
from .stopping import Stopper, copied, remove_files
from .wake_verification import WakeVerifier


@dataclass(frozen=True)
class ManagerSettings:
    """How the launcher runs its instances (its command-line flags)."""

    host: str  # the launcher's address, which every instance binds
    port: int  # the launcher's own API port, which no instance may take
    state_dir: Path
    stop_grace_seconds: float = 10.0
    cpu_kv_cache_bytes: int = DEFAULT_CPU_KV_CACHE_BYTES
    liveness: LivenessPolicy = field(default_factory=LivenessPolicy)
    # The most a forwarded sleep or wake may take; one to an instance that hangs fails sooner, when
    # its liveness check kills it.
    backend_timeout_seconds: float = 120.0
    dialect: Dialect = field(default_factory=Dialect)  # which events are recorded
    verify_wakes: bool = True  # the post-wake check, for instances that do not say (VllmConfig.verify_wakes)
    zygote: bool = True  # instances fork from their runtime's zygote (`zygote`), else from the launcher


class InstanceManager:
    def __init__(
        self,
        runtimes: dict[str, Runtime],
        gpus: GpuInventory,
        metrics: LauncherMetrics,
        events: EventLog,
        settings: ManagerSettings,
        servers: InstanceServers | None = None,  # a simulation's stand-ins for the instances' servers
        stopper: Stopper | None = None,  # a simulation's, for instances with no process
        forker: Forker | None = None,  # a simulation's, for instances with no process
    ) -> None:
        self.runtimes = runtimes
        self.gpus = gpus
        self.metrics = metrics
        self.settings = settings
        self.host = settings.host
        self.events = events
        self.servers = servers or InstanceServers(settings.host, settings.backend_timeout_seconds)
        self.stopper = stopper or Stopper(settings.stop_grace_seconds)
        self.verifier = WakeVerifier(self.servers, self.stopper, metrics)
        supervision = Supervision(self.servers, self.verifier, self.stopper, metrics, settings.liveness)
        self.forker = forker or ProcessForker(runtimes, metrics, supervision, self._on_exit, settings.zygote)
        self._instances: dict[str, Instance] = {}
        self._deleting: set[str] = set()  # the instances a DELETE is removing
        self._tasks = Background()  # each instance's supervisor and output copy
        metrics.count_instances_with(self.count_by_state)

    # ----- reading: a read returns what was recorded; it asks no server, waits for nothing and changes nothing

    def get(self, instance_id: str) -> Instance:
        instance = self._instances.get(instance_id)
        if instance is None:
            raise NotFound(f"Instance {instance_id} not found")
        return instance

    async def state(self, instance_id: str) -> InstanceState:
        instance = self.get(instance_id)
        return instance.state(detail=True, gpu_usage=await asyncio.to_thread(gpu_memory_by_pid))

    async def list_detailed(self) -> AllInstancesState:
        instances = list(self._instances.values())
        gpu_usage = await asyncio.to_thread(gpu_memory_by_pid)
        return AllInstancesState(
            revision=self.events.revision,
            boot_id=self.events.boot_id,
            total_instances=len(instances),
            running_instances=sum(i.running for i in instances),
            instances=[i.state(detail=True, gpu_usage=gpu_usage) for i in instances],
        )

    def list_ids(self) -> InstanceIds:
        return InstanceIds(
            revision=self.events.revision,
            boot_id=self.events.boot_id,
            instance_ids=list(self._instances),
            count=len(self._instances),
        )

    def snapshot(self) -> list[InstanceState]:
        return [i.state() for i in self._instances.values()]

    def count_by_state(self) -> dict[str, int]:
        counts = dict.fromkeys(("starting", "ready", "sleeping", "stopped"), 0)
        for i in self._instances.values():
            key = "stopped" if not i.running else "sleeping" if i.sleeping else "ready" if i.ready else "starting"
            counts[key] += 1
        return counts

    # ----- creating

    async def create(self, config: VllmConfig, instance_id: str | None = None) -> InstanceState:
        """Check everything that could fail later, then fork; nothing is started for a refused request."""
        admitted = await self._admit(config, instance_id)
        # `_admit` ends with the checks that must not be raced, and nothing awaits from there to the insert.
        work_dir = self.settings.state_dir / admitted.instance_id
        work_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        instance = self._add(admitted, self.forker.fork(admitted, work_dir), work_dir, started)
        instance.move(Phase.STARTING)
        self.forker.supervise(instance, admitted.runtime, self._tasks.start)
        return instance.state()

    def _add(self, admitted: Admission, forked: Forked, work_dir: Path, created_at: float) -> Instance:
        """The admitted instance, held (not yet announced)."""
        verifies = self.settings.verify_wakes if admitted.config.verify_wakes is None else admitted.config.verify_wakes
        instance = Instance(
            id=admitted.instance_id,
            config=admitted.config,
            argv=admitted.argv,
            defaults_applied=admitted.defaults.chosen,
            port=admitted.port,
            pid=forked.pid,
            work_dir=work_dir,
            temp_dir=forked.temp_dir,
            created_at=created_at,
            stats=forked.stats,
            runtime_name=admitted.runtime.name,
            startup=forked.startup,
            publish=self._publish,
            wake_check=WakeCheck(
                status=WakeCheckStatus.PENDING if verifies and forked.checks_wakes else WakeCheckStatus.OFF
            ),
        )
        self._instances[instance.id] = instance
        return instance

    async def _admit(self, config: VllmConfig, instance_id: str | None) -> Admission:
        """Every check of a create, in order (`admission`); what to start. It returns right after the checks
        that must not be raced (no await between them and the caller's insert)."""
        launcher = LauncherFacts(self.host, self.settings.port, self.settings.cpu_kv_cache_bytes)
        request = admission.read(config, instance_id or str(uuid.uuid4()), self.runtimes, launcher, self._held())
        indices = await self.gpus.indices(config.gpu_uuids) if config.gpu_uuids else None
        memory = None
        if request.runtime.wants_gpu_memory(request.parsed):
            devices = admission.environment(request, indices).get(admission.VISIBLE_DEVICES)
            memory = await gpu_memory.measure(devices)
        # From here to the insert there is no await: the checks cannot be raced.
        admitted = admission.plan(request, GpuFacts(indices, memory), launcher, self._held())
        validation.check_port_free(self.host, admitted.port)
        return admitted

    def _held(self) -> Held:
        return Held(self._instances.keys(), {i.port: i.id for i in self._instances.values() if i.running})

    # ----- sleeping and waking (E1)

    async def sleep(self, instance_id: str, level: int) -> InstanceState:
        """Sleep at `level` 1 (weights offloaded to host memory) or 2 (discarded)."""
        instance = self.get(instance_id)
        async with instance.lock:
            self._require_serving(instance)
            if not instance.sleeping:
                started = time.monotonic()
                await self.servers.sleep(instance, level)
                self._require_serving(instance)  # it may have stopped as it answered
                elapsed = time.monotonic() - started
                self.metrics.sleep_seconds.labels(str(level)).observe(elapsed)
                moved = self._moved_bytes(instance, startup_phases.SLEPT, started)
                if moved is not None:
                    self.metrics.sleep_bytes_per_second.labels(str(level)).observe(moved / max(elapsed, 1e-6))
                instance.offloaded_bytes = moved if level == 1 else None
                instance.sleep_level = level
                instance.move(Phase.ASLEEP)
        return instance.state()

    async def wake(self, instance_id: str) -> InstanceState:
        instance = self.get(instance_id)
        async with instance.lock:
            self._require_serving(instance)
            if instance.sleeping:
                started = time.monotonic()
                await self.servers.wake(instance)
                elapsed = time.monotonic() - started
                self.metrics.wake_seconds.observe(elapsed)
                moved = self._moved_bytes(instance, startup_phases.WOKE, started) or instance.offloaded_bytes
                if moved is not None:
                    self.metrics.wake_bytes_per_second.observe(moved / max(elapsed, 1e-6))
                instance.offloaded_bytes = None
                await self.verifier.check(instance, admission.runtime_named(self.runtimes, instance.config.runtime))
                self._require_serving(instance)  # it may have stopped as it answered
                instance.move(Phase.AWAKE)
        return instance.state()

    @staticmethod
    def _moved_bytes(instance: Instance, kind: str, since: float) -> int | None:
        """The bytes the runtime reported its sleep or wake (`kind`) since `since` moved; None where it reports none."""
        return startup_phases.moved_bytes(startup_phases.read_marks(instance.marks_path), kind, since)

    @staticmethod
    def _require_serving(instance: Instance) -> None:
        if not instance.running:
            raise Conflict(
                f"Instance {instance.id} is stopped (exit code {instance.exit_code})", ErrorReason.NOT_RUNNING
            )
        if not instance.ready:
            raise Conflict(f"Instance {instance.id} is still starting; retry when it is ready", ErrorReason.NOT_READY)

    # ----- stopping and deleting

    async def delete(self, instance_id: str) -> InstanceState:
        instance = self.get(instance_id)
        if instance_id in self._deleting:
            raise NotFound(f"Instance {instance_id} not found")  # another DELETE is removing it
        self._deleting.add(instance_id)
        await self.stopper.stop(instance)
        del self._instances[instance_id]
        await copied(instance)
        remove_files(instance)
        instance.deleted()
        self._deleting.discard(instance_id)
        instance.log.info("deleted instance %s", instance_id)
        return instance.state()

    async def delete_all(self) -> DeleteAllResult:
        ids = [i for i in self._instances if i not in self._deleting]
        results = await asyncio.gather(*(self.delete(i) for i in ids), return_exceptions=True)
        stopped = [r for r in results if isinstance(r, InstanceState)]
        return DeleteAllResult(stopped_instances=stopped, total_stopped=len(stopped))

    def _on_exit(self, instance: Instance, exit_code: int) -> None:
        """The reaper's word that the instance's server exited."""
        if instance.stop_reason is None and not instance.end.stop_asked:
            instance.stop_reason = StopReason.EXITED
        if instance.stop_reason is not None:
            self.metrics.stops.labels(instance.stop_reason).inc()
        if instance.id not in self._deleting:  # else the DELETE reports it
            instance.log.warning(
                "instance %s stopped with exit code %d (%s); its log: %s",
                instance.id, exit_code, instance.stop_reason or "asked to stop", instance.log_path,
            )  # fmt: skip
        instance.exited_with(exit_code)

    def start_forker(self) -> None:
        """Get the forker ready (every runtime's zygote started), on the event loop at the launcher's start, before it
        serves."""
        self.forker.start()

    async def shutdown(self) -> None:
        """Stop every instance and its process tree, and the zygotes; used when the launcher itself stops."""
        self.forker.stop()
        instances = list(self._instances.values())
        await asyncio.gather(*(self.stopper.stop(i) for i in instances))
        await asyncio.gather(*(copied(i) for i in instances))
        for instance in instances:
            remove_files(instance)
        self._tasks.cancel()
        self.events.close_all()
        await self.servers.close()

    # ----- plumbing

    def _publish(self, instance: Instance, type_: EventType, exit_code: int | None = None) -> None:
        """Publish an instance's move; not the stop a DELETE causes, which the DELETED event reports (as FMA's
        launcher does)."""
        if not self.settings.dialect.publishes(type_) or (type_ is EventType.STOPPED and instance.id in self._deleting):
            return
        instance.revision = self.events.next_revision()
        self.events.publish(type_, instance.state(), exit_code)
