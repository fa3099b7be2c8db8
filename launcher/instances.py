"""The launcher's core: instances forked from the preloaded parent, and their life cycle.

Every state change bumps the manager-wide revision and is published as a watch event. All
mutations happen on the event loop, and the checks that guard them (duplicate IDs, ports) run
without an await between check and insert, so concurrent requests cannot race past them.

A create checks everything that could fail later (sizes, environment, port, the runtime's own
option parser) before it forks. From its first ready on, an instance's liveness is watched
(`liveness`): one whose engine dies or whose /health stops answering is killed and reported
STOPPED with its `stop_reason`; a call forwarded to it (sleep, wake) ends when it stops.

At its first ready an instance's answer to a short greedy probe is recorded (`wake_check`); every wake,
through the launcher or behind its back (vLLM's own /wake_up, seen at the next read or liveness probe),
is checked against it before the instance is reported awake, and one that fails is killed
(`WakeCheckFailed`).
"""

import asyncio
import contextlib
import logging
import re
import shlex
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from api.launcher import (
    AllInstancesState,
    DeleteAllResult,
    ErrorReason,
    EventType,
    InstanceIds,
    InstanceState,
    InstanceStatus,
    StartupTimes,
    StopReason,
    VllmConfig,
    WakeCheck,
    WakeCheckStatus,
)
from api.log_format import INSTANCE_FIELD

from . import gpu_memory, liveness, output_relay, process_control, startup_phases, validation, wake_check
from .dialect import Dialect
from .engine_defaults import DEFAULT_CPU_KV_CACHE_BYTES, EngineDefaults, Machine
from .errors import BackendError, BackendTimeout, BadRequest, Conflict, InvalidOptions, NotFound, WakeCheckFailed
from .events import EventLog
from .fork import InstanceSpec
from .gpu_usage import gpu_memory_by_pid
from .gpus import GpuInventory
from .liveness import EngineProcesses, LivenessPolicy, Verdict
from .metrics import LauncherMetrics, ZygoteSample
from .process_stats import ProcessTreeStats
from .runtimes import ParsedOptions, Runtime
from .wake_check import ProbeAnswer
from .zygote import Zygote, Zygotes

log = logging.getLogger(__name__)

INSTANCE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
READINESS_POLL_SECONDS = 0.02  # a refused connection costs little; the first_healthy phase is no longer than this
# vLLM binds ZMQ IPC sockets named by a 36-character UUID inside TMPDIR, and zmq refuses socket paths
# near the 107-byte sun_path limit; an instance's TMPDIR therefore lives in a short directory.
MAX_IPC_PATH_CHARS = 100
IPC_NAME_CHARS = 36
TEMP_DIR_PREFIX = "dualpods-"
SLEEP_STATE_TIMEOUT = aiohttp.ClientTimeout(total=2)
CONNECT_TIMEOUT_S = 5.0
REAP_WAIT_S = 1.0  # for the exit code of an instance just killed
LOG_FILE = "log"  # in the instance's work directory
MAX_DETAIL_CHARS = 500  # of a wake check's detail, which every event of the instance carries
OUTPUT_DRAIN_S = 5.0  # the most a stop waits for an instance's last output lines to be copied
DEFAULT_RUNTIME = "vllm"  # when the instance names none
T = TypeVar("T")


class InstanceExited(Exception):
    """The instance's server exited, or the launcher began stopping it, while the launcher waited on
    something of it."""


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


@dataclass(frozen=True)
class Admission:
    """A create that passed every check: what to start, and how."""

    instance_id: str
    config: VllmConfig  # with the GPUs' CUDA_VISIBLE_DEVICES echoed in `env_vars`
    runtime: Runtime
    parsed: ParsedOptions
    argv: list[str]  # the effective options: the user's, the defaults added, the launcher's --host
    defaults: EngineDefaults
    port: int
    env: dict[str, str]  # the instance's environment (the user's, and CUDA_VISIBLE_DEVICES)


@dataclass
class Instance:
    id: str
    config: VllmConfig
    argv: list[str]
    defaults_applied: dict[str, str]
    port: int
    pid: int
    work_dir: Path
    temp_dir: Path
    created_at: float
    stats: ProcessTreeStats
    runtime_name: str
    startup: StartupTimes
    revision: int = 0
    status: InstanceStatus = InstanceStatus.RUNNING
    ready: bool = False
    sleeping: bool = False
    sleep_level: int | None = None
    exit_code: int | None = None
    stop_reason: StopReason | None = None
    deleting: bool = False
    engine: EngineProcesses | None = None  # found at the first ready
    health_failing: bool = False  # its last /health probe failed
    wake_check: WakeCheck = field(default_factory=lambda: WakeCheck(status=WakeCheckStatus.OFF))
    output: "asyncio.Task[None] | None" = None  # copies its log to the launcher's stdout (output_relay)
    probe: ProbeAnswer | None = None  # recorded at its first ready
    offloaded_bytes: int | None = None  # what its last level-1 sleep reported moving out, which a wake moves back
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    stop_asked: asyncio.Event = field(default_factory=asyncio.Event)  # by a DELETE or the launcher's shutdown
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def log_path(self) -> Path:
        return self.work_dir / LOG_FILE

    @property
    def marks_path(self) -> Path:
        return self.work_dir / startup_phases.MARKS_FILE

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """The launcher's log, its records about this instance carrying its ID (`instance`)."""
        return logging.LoggerAdapter(log, {INSTANCE_FIELD: self.id})

    @property
    def running(self) -> bool:
        return self.status is InstanceStatus.RUNNING

    @property
    def stopping(self) -> bool:
        return self.stop_asked.is_set()

    def state(self, detail: bool = False, gpu_usage: dict[int, int] | None = None) -> InstanceState:
        return InstanceState(
            status=self.status,
            instance_id=self.id,
            revision=self.revision,
            options=self.config.options,
            gpu_uuids=self.config.gpu_uuids,
            env_vars=self.config.env_vars,
            annotations=self.config.annotations,
            runtime=self.config.runtime or DEFAULT_RUNTIME,
            ready=self.ready,
            sleeping=self.sleeping,
            sleep_level=self.sleep_level,
            effective_options=shlex.join(self.argv),
            defaults_applied=self.defaults_applied or None,
            port=self.port,
            exit_code=self.exit_code,
            stop_reason=self.stop_reason,
            wake_check=self.wake_check.model_copy(),
            process=self.stats.sample(gpu_usage) if detail and self.running else None,
            startup=self.startup.model_copy() if detail else None,
        )


class InstanceManager:
    def __init__(
        self,
        runtimes: dict[str, Runtime],
        gpus: GpuInventory,
        metrics: LauncherMetrics,
        events: EventLog,
        settings: ManagerSettings,
    ) -> None:
        self.runtimes = runtimes
        self.gpus = gpus
        self.metrics = metrics
        self.settings = settings
        self.host = settings.host
        # Where the launcher itself reaches an instance bound to `host`.
        self.contact_host = "127.0.0.1" if self.host in ("", "0.0.0.0", "::") else self.host
        self.events = events
        self.reaper = process_control.ChildReaper()
        self._instances: dict[str, Instance] = {}
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        distinct = {id(r): r for r in runtimes.values()}.values() if settings.zygote else ()
        self.zygotes = Zygotes(Zygote(r, self.reaper, metrics.zygote_restarts.labels(r.name).inc) for r in distinct)
        metrics.count_instances_with(self.count_by_state)
        metrics.sample_zygotes_with(
            lambda: [ZygoteSample(z.runtime.name, z.ready, z.memory()) for z in self.zygotes.all]
        )

    # ----- reading

    def get(self, instance_id: str) -> Instance:
        instance = self._instances.get(instance_id)
        if instance is None:
            raise NotFound(f"Instance {instance_id} not found")
        return instance

    async def state(self, instance_id: str) -> InstanceState:
        instance = self.get(instance_id)
        await self._refresh_sleep_state(instance)
        return instance.state(detail=True, gpu_usage=await asyncio.to_thread(gpu_memory_by_pid))

    async def list_detailed(self) -> AllInstancesState:
        instances = list(self._instances.values())
        await asyncio.gather(*(self._refresh_sleep_state(i) for i in instances))
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
        instance_id, runtime, effective, port = admitted.instance_id, admitted.runtime, admitted.argv, admitted.port
        work_dir = self.settings.state_dir / instance_id
        work_dir.mkdir(parents=True, exist_ok=True)
        temp_dir = _short_temp_dir()
        child_env = {**runtime.child_environment(), "TMPDIR": str(temp_dir), **admitted.env}
        spec = InstanceSpec(
            argv=effective,
            env=child_env,
            log_path=str(work_dir / LOG_FILE),
            marks_path=str(work_dir / startup_phases.MARKS_FILE),
            title=f"dualpods-instance {instance_id}",
        )
        started = time.monotonic()
        pid, forked_by = self.zygotes.fork(runtime, spec)
        self.metrics.fork_seconds.observe(time.monotonic() - started)
        self.metrics.forks.labels(runtime.name, forked_by).inc()
        instance = Instance(
            id=instance_id,
            config=admitted.config,
            argv=effective,
            defaults_applied=admitted.defaults.chosen,
            port=port,
            pid=pid,
            work_dir=work_dir,
            temp_dir=temp_dir,
            created_at=started,
            stats=ProcessTreeStats(pid),
            runtime_name=runtime.name,
            startup=StartupTimes(forked_by=forked_by),
            wake_check=WakeCheck(
                status=WakeCheckStatus.PENDING if self._verifies(admitted.config) else WakeCheckStatus.OFF
            ),
        )
        self._instances[instance_id] = instance
        instance.log.info(
            "created instance %s (pid %d, port %d, forked by the %s): %s; defaults added: %s",
            instance_id, pid, port, forked_by, shlex.join(effective), admitted.defaults.chosen or "none",
        )  # fmt: skip
        self._publish(instance, EventType.CREATED)
        self.reaper.watch(pid, lambda code: self._on_exit(instance, code))
        instance.output = self._spawn(output_relay.follow(instance.log_path, instance.id, instance.exited))
        self._spawn(self._serve(instance, runtime))
        return instance.state()

    async def _admit(self, config: VllmConfig, instance_id: str | None) -> Admission:
        """Every check of a create, in order; what to start. It returns right after the checks that must
        not be raced (no await between them and the caller's insert)."""
        if instance_id is None:
            instance_id = str(uuid.uuid4())
        elif not INSTANCE_ID.match(instance_id):
            raise BadRequest(
                f"invalid instance ID {instance_id!r}: use 1-128 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        self._check_id_free(instance_id)
        validation.check_body_sizes(config)
        runtime = self._runtime(config.runtime)
        try:
            argv = shlex.split(config.options)
        except ValueError as err:
            raise InvalidOptions(f"invalid options: cannot split {config.options!r}: {err}") from None
        parsed = runtime.parse(argv)
        if "host" in parsed.explicit and parsed.values.host != self.host:
            raise InvalidOptions(
                f"invalid options: --host {parsed.values.host} is not this launcher's address {self.host}; "
                "leave --host out and the launcher sets it"
            )
        port = int(parsed.values.port)
        validation.check_port(port, self.settings.port)
        env = dict(config.env_vars or {})
        if config.gpu_uuids:  # as FMA: an empty list leaves every GPU visible
            indices = await self.gpus.indices(config.gpu_uuids)
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in indices)
            # Echoed in the state, as FMA does, so clients see the devices the instance got.
            config = config.model_copy(update={"env_vars": env})
        validation.check_environment(env)
        defaults = runtime.defaults(parsed, await self._machine(runtime, parsed, env, config))
        effective = [*argv, *defaults.flags]
        if "host" not in parsed.explicit:
            effective += ["--host", self.host]
        validation.check_effective_options(shlex.join(effective))

        # From here to the insert there is no await: the checks cannot be raced.
        self._check_id_free(instance_id)
        holder = next((i for i in self._instances.values() if i.running and i.port == port), None)
        if holder is not None:
            raise Conflict(f"port {port} is already used by instance {holder.id}", ErrorReason.PORT_IN_USE)
        validation.check_port_free(self.host, port)
        return Admission(instance_id, config, runtime, parsed, effective, defaults, port, env)

    def _verifies(self, config: VllmConfig) -> bool:
        return self.settings.verify_wakes if config.verify_wakes is None else config.verify_wakes

    def _check_id_free(self, instance_id: str) -> None:
        if instance_id in self._instances:
            raise Conflict(f"Instance {instance_id} already exists", ErrorReason.ALREADY_EXISTS)

    def _runtime(self, name: str | None) -> Runtime:
        runtime = self.runtimes.get(name or DEFAULT_RUNTIME)
        if runtime is None:
            raise BadRequest(f"unknown runtime {name!r}; this launcher runs: {', '.join(sorted(self.runtimes))}")
        return runtime

    async def _machine(
        self, runtime: Runtime, parsed: ParsedOptions, env: dict[str, str], config: VllmConfig
    ) -> Machine:
        """What the engine defaults depend on; GPU memory is measured only when they need it."""
        gpus = await gpu_memory.measure(env.get("CUDA_VISIBLE_DEVICES")) if runtime.wants_gpu_memory(parsed) else None
        return Machine(
            on_cpu=runtime.on_cpu,
            gpus=gpus,
            cpu_kv_cache_bytes=self.settings.cpu_kv_cache_bytes,
            sleeper_reserve_bytes=config.gpu_sleeper_reserve_bytes or 0,
        )

    async def _serve(self, instance: Instance, runtime: Runtime) -> None:
        """The instance's life after the fork: until it is first ready, then its liveness until it stops."""
        await self._await_ready(instance)
        if not instance.running:
            return
        if instance.wake_check.status is WakeCheckStatus.PENDING:
            self._spawn(self._record_probe(instance, runtime))
        instance.engine = EngineProcesses.find(instance.pid, runtime.is_engine_process)
        if instance.engine is None:
            return  # its server is already gone; the reaper reports it
        if instance.engine.engine:
            instance.log.info(
                "instance %s: watching its engine processes %s", instance.id, ", ".join(instance.engine.titles)
            )
        try:
            verdict = await self._while_running(
                instance, liveness.watch(instance.engine, lambda: self._probe_health(instance), self.settings.liveness)
            )
        except InstanceExited:
            return
        if verdict is not None:
            self._kill(instance, verdict)

    async def _await_ready(self, instance: Instance) -> None:
        """Poll the new server's /health until it answers; only during start-up."""
        url = f"{self._base_url(instance)}/health"
        while instance.running:
            try:
                async with self.session.get(url, timeout=SLEEP_STATE_TIMEOUT) as response:
                    if response.status == 200:
                        break
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(READINESS_POLL_SECONDS)
        if not instance.running:
            return
        instance.ready = True
        ready_at = time.monotonic()
        elapsed = ready_at - instance.created_at
        self.metrics.ready_seconds.observe(elapsed)
        phases = startup_phases.startup_phases(
            instance.created_at, startup_phases.read_marks(instance.marks_path), ready_at
        )
        instance.startup.phases, instance.startup.total_seconds = phases, round(elapsed, 6)
        for phase, seconds in phases.items():
            self.metrics.startup_phase_seconds.labels(phase, instance.runtime_name).observe(seconds)
        instance.log.info(
            "instance %s is ready after %.2f s: %s", instance.id, elapsed,
            ", ".join(f"{phase} {seconds:.3f} s" for phase, seconds in phases.items()),
        )  # fmt: skip
        self._publish(instance, EventType.READY)

    async def _asleep(self, instance: Instance) -> bool:
        try:
            async with self.session.get(
                f"{self._base_url(instance)}/is_sleeping", timeout=SLEEP_STATE_TIMEOUT
            ) as response:
                return response.status == 200 and (await response.json())["is_sleeping"] is True
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError):
            return False

    async def _record_probe(self, instance: Instance, runtime: Runtime, locked: bool = False) -> None:
        """Record the instance's answer to the probe, once it is ready (not before: a runtime's first completion
        can take seconds, vLLM's first with log-probabilities on a CPU about 2.5 s, which would delay every cold
        start); a sleep waits for it. Without an answer its wakes go unchecked (and the state says why)."""
        started = time.monotonic()
        ask = wake_check.ask(self.session, self._base_url(instance), wake_check.PROBE_PROMPT, runtime.probe_logprobs)
        try:
            async with contextlib.nullcontext() if locked else instance.lock:
                answer = await self._while_running(instance, ask)
        except InstanceExited:
            return
        except wake_check.ProbeError as err:
            if instance.stopping:  # its server is shutting down; asking it more would hold up its exit
                return
            if await self._asleep(instance):  # put to sleep behind the launcher's back meanwhile
                instance.log.info(
                    "instance %s: its probe was cut short by a sleep; recorded at its next wake", instance.id
                )
                return
            instance.log.warning(
                "instance %s: cannot record its probe, so its wakes go unchecked: %s", instance.id, err
            )
            instance.wake_check = WakeCheck(status=WakeCheckStatus.UNAVAILABLE, detail=str(err)[:MAX_DETAIL_CHARS])
            return
        instance.probe = answer
        instance.wake_check = WakeCheck(status=WakeCheckStatus.RECORDED, probe=answer.recorded())
        instance.log.info("instance %s: recorded its probe in %.3f s: %s", instance.id, time.monotonic() - started,
                 answer.recorded().model_dump_json(exclude_none=True))  # fmt: skip

    async def _check_wake(self, instance: Instance, runtime: Runtime) -> None:
        """Replay the probe of an instance just woken; kill it and raise WakeCheckFailed if it answers otherwise.
        One whose probe a sleep cut short before it was recorded has it recorded now."""
        recorded = instance.probe
        if recorded is None:
            self.metrics.wake_checks.labels("unchecked").inc()
            if instance.wake_check.status is WakeCheckStatus.PENDING:
                await self._record_probe(instance, runtime, locked=True)
            return
        started = time.monotonic()
        prompt = recorded.prompt_token_ids or wake_check.PROBE_PROMPT
        ask = wake_check.ask(self.session, self._base_url(instance), prompt, recorded.logprobs is not None)
        try:
            problem = wake_check.compare(recorded, await self._while_running(instance, ask))
        except wake_check.ProbeError as err:
            problem = str(err)
        except InstanceExited:
            raise BackendError(
                f"instance {instance.id} stopped (exit code {instance.exit_code}) during its post-wake check"
            ) from None
        elapsed = time.monotonic() - started
        self.metrics.wake_check_seconds.observe(elapsed)
        instance.wake_check.last_seconds = round(elapsed, 6)
        if problem is None:
            instance.wake_check.passed += 1
            self.metrics.wake_checks.labels("passed").inc()
            return
        self.metrics.wake_checks.labels("failed").inc()
        instance.wake_check.detail = problem[:MAX_DETAIL_CHARS]
        self._kill(instance, Verdict(StopReason.WAKE_CHECK_FAILED, f"woken, it failed its post-wake check: {problem}"))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(REAP_WAIT_S):
                await instance.exited.wait()
        raise WakeCheckFailed(
            f"instance {instance.id} failed its post-wake check and was killed: {problem}; create it again"
        )

    async def _probe_health(self, instance: Instance) -> str | None:
        """One liveness probe of the instance's /health: None when it answered 200, else what went wrong. A healthy
        instance's sleep state is looked at too, so a sleep or wake asked of its server directly is seen (and a
        wake checked) within an interval, whether or not anyone reads the launcher meanwhile."""
        timeout_s = self.settings.liveness.health_timeout_s
        try:
            async with self.session.get(
                f"{self._base_url(instance)}/health", timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as response:
                problem = None if response.status == 200 else f"it answered {response.status}"
        except TimeoutError:
            problem = f"no answer within {timeout_s:g} s"
        except aiohttp.ClientError as err:
            problem = f"{type(err).__name__}: {err}"
        instance.health_failing = problem is not None
        if problem is None and not instance.lock.locked():
            self._spawn(self._refresh_sleep_state(instance))
        return problem

    def _kill(self, instance: Instance, verdict: Verdict) -> None:
        """Kill a broken instance's whole process group at once: there is nothing left to shut down
        gracefully. Its STOPPED event follows when the reaper has its exit code. The first verdict stands: the
        kill itself ends its engine processes, maybe seen before its server's exit."""
        if not instance.running or instance.stopping or instance.stop_reason is not None:
            return  # it is already going: this stop was asked for, or it is already being killed
        instance.log.warning(
            "instance %s: %s; killing its process group (%s)", instance.id, verdict.message, verdict.reason
        )
        instance.stop_reason = verdict.reason
        self._signal(instance, signal.SIGKILL)

    # ----- sleeping and waking (E1)

    async def sleep(self, instance_id: str, level: int) -> InstanceState:
        """Sleep at `level` 1 (weights offloaded to host memory) or 2 (discarded)."""
        instance = self.get(instance_id)
        async with instance.lock:
            self._require_serving(instance)
            if not instance.sleeping:
                started = time.monotonic()
                await self._call_backend(instance, "POST", f"/sleep?level={level}")
                elapsed = time.monotonic() - started
                self.metrics.sleep_seconds.labels(str(level)).observe(elapsed)
                moved = self._moved_bytes(instance, startup_phases.SLEPT, started)
                if moved is not None:
                    self.metrics.sleep_bytes_per_second.labels(str(level)).observe(moved / max(elapsed, 1e-6))
                instance.offloaded_bytes = moved if level == 1 else None
                instance.sleeping, instance.sleep_level = True, level
                self._publish(instance, EventType.SLEEPING)
        return instance.state()

    async def wake(self, instance_id: str) -> InstanceState:
        instance = self.get(instance_id)
        async with instance.lock:
            self._require_serving(instance)
            if instance.sleeping:
                started = time.monotonic()
                await self._call_backend(instance, "POST", "/wake_up")
                elapsed = time.monotonic() - started
                self.metrics.wake_seconds.observe(elapsed)
                moved = self._moved_bytes(instance, startup_phases.WOKE, started) or instance.offloaded_bytes
                if moved is not None:
                    self.metrics.wake_bytes_per_second.observe(moved / max(elapsed, 1e-6))
                instance.offloaded_bytes = None
                await self._check_wake(instance, self._runtime(instance.config.runtime))
                instance.sleeping, instance.sleep_level = False, None
                self._publish(instance, EventType.AWAKE)
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

    async def _refresh_sleep_state(self, instance: Instance) -> None:
        """Pick up sleeps and wakes that clients asked of the server directly (vLLM's own routes), a wake
        checked before it is recorded; not of one whose /health fails, which would hold every read for the
        timeout."""
        if (
            not (instance.running and instance.ready)
            or instance.stopping
            or instance.lock.locked()
            or instance.health_failing
        ):
            return
        try:
            async with self.session.get(
                f"{self._base_url(instance)}/is_sleeping", timeout=SLEEP_STATE_TIMEOUT
            ) as response:
                sleeping = bool((await response.json())["is_sleeping"]) if response.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError):
            return
        if sleeping is None or sleeping == instance.sleeping or instance.lock.locked() or not instance.running:
            return
        async with instance.lock:
            if sleeping == instance.sleeping or not instance.running:
                return  # another read saw it first
            if not sleeping:
                try:
                    await self._check_wake(instance, self._runtime(instance.config.runtime))
                except (WakeCheckFailed, BackendError):
                    return  # killed, or stopped meanwhile: its STOPPED event says so
            instance.sleeping = sleeping
            instance.sleep_level = None
            self._publish(instance, EventType.SLEEPING if sleeping else EventType.AWAKE)

    async def _call_backend(self, instance: Instance, method: str, path: str) -> None:
        """Forward a call to the instance's server; it fails (never hangs) when the server does not answer
        in `backend_timeout_seconds`, or sooner, when the instance stops meanwhile (its liveness check
        kills one that hangs)."""
        timeout_s = self.settings.backend_timeout_seconds
        try:
            await self._while_running(instance, self._request_backend(instance, method, path, timeout_s))
        except TimeoutError:
            raise BackendTimeout(
                f"instance {instance.id} did not answer {method} {path} within {timeout_s:g} s"
            ) from None
        except (InstanceExited, aiohttp.ClientError) as err:
            if instance.stopping and instance.running:
                raise BackendError(f"instance {instance.id} is being stopped; {method} {path} was cut short") from None
            if instance.stop_reason is None and instance.running:
                raise BackendError(f"instance {instance.id} did not answer {method} {path}: {err!r}") from None
            # It was judged dead meanwhile (and killed, which may have cut this call first), or it exited.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REAP_WAIT_S):
                    await instance.exited.wait()
            error = BackendTimeout if instance.stop_reason is StopReason.UNRESPONSIVE else BackendError
            stopped = f"{instance.stop_reason}, " if instance.stop_reason else ""
            raise error(
                f"instance {instance.id} stopped ({stopped}exit code {instance.exit_code}) before it answered "
                f"{method} {path}"
            ) from None

    async def _request_backend(self, instance: Instance, method: str, path: str, timeout_s: float) -> None:
        timeout = aiohttp.ClientTimeout(total=timeout_s, connect=CONNECT_TIMEOUT_S)
        async with self.session.request(method, f"{self._base_url(instance)}{path}", timeout=timeout) as response:
            if response.status >= 300:
                body = (await response.text())[:500]
                raise BackendError(f"instance {instance.id} answered {method} {path} with {response.status}: {body}")

    @staticmethod
    async def _while_running(instance: Instance, work: Coroutine[Any, Any, T]) -> T:
        """`work`'s result, or InstanceExited (and `work` cancelled) if the instance's server exits or is asked
        to stop first: a request of the launcher's still open would hold up the server's graceful shutdown
        (uvicorn waits for its connections), vLLM's for good when its engine core is gone already."""
        task = asyncio.ensure_future(work)
        ended = [asyncio.ensure_future(instance.exited.wait()), asyncio.ensure_future(instance.stop_asked.wait())]
        try:
            await asyncio.wait({task, *ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in ended:
                waiter.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if task.cancelled():
            raise InstanceExited()
        return task.result()

    def _base_url(self, instance: Instance) -> str:
        return f"http://{self.contact_host}:{instance.port}"

    # ----- stopping and deleting

    async def delete(self, instance_id: str) -> InstanceState:
        instance = self.get(instance_id)
        if instance.deleting:
            raise NotFound(f"Instance {instance_id} not found")  # another DELETE is removing it
        instance.deleting = True
        await self._stop(instance)
        del self._instances[instance_id]
        await _copied(instance)
        _remove_files(instance)
        self._publish(instance, EventType.DELETED)
        instance.log.info("deleted instance %s", instance_id)
        return instance.state()

    async def delete_all(self) -> DeleteAllResult:
        ids = [i.id for i in self._instances.values() if not i.deleting]
        results = await asyncio.gather(*(self.delete(i) for i in ids), return_exceptions=True)
        stopped = [r for r in results if isinstance(r, InstanceState)]
        return DeleteAllResult(stopped_instances=stopped, total_stopped=len(stopped))

    async def _stop(self, instance: Instance) -> None:
        """SIGTERM the instance's process group (and SIGCONT, so a stopped process gets it too), SIGKILL
        it after the grace period."""
        if instance.running:
            instance.stop_asked.set()
            self._signal(instance, signal.SIGTERM)
            self._signal(instance, signal.SIGCONT)
            grace = self.settings.stop_grace_seconds
            try:
                async with asyncio.timeout(grace):
                    await instance.exited.wait()
            except TimeoutError:
                instance.log.warning("instance %s ignored SIGTERM for %.0f s; killing it", instance.id, grace)
                self._signal(instance, signal.SIGKILL)
                await instance.exited.wait()

    @staticmethod
    def _signal(instance: Instance, signum: int) -> None:
        """Signal the process group of a running (so not yet reaped) instance."""
        process_control.signal_group(instance.pid, signum, leader_unreaped=instance.running)

    def _on_exit(self, instance: Instance, exit_code: int) -> None:
        instance.status = InstanceStatus.STOPPED
        instance.exit_code = exit_code
        instance.ready = False
        if instance.stop_reason is None and not instance.stopping:
            instance.stop_reason = StopReason.EXITED
        instance.exited.set()
        # The engine core may outlive the server process it belonged to.
        process_control.signal_group(instance.pid, signal.SIGKILL)
        if instance.stop_reason is not None:
            self.metrics.stops.labels(instance.stop_reason).inc()
        if instance.deleting:
            return  # the DELETE reports it
        instance.log.warning(
            "instance %s stopped with exit code %d (%s); its log: %s",
            instance.id, exit_code, instance.stop_reason or "asked to stop", instance.log_path,
        )  # fmt: skip
        self._publish(instance, EventType.STOPPED, exit_code=exit_code)

    def start_zygotes(self) -> None:
        """Start every runtime's zygote and wait until they are ready (at the launcher's start, before it serves)."""
        self.zygotes.start()

    async def shutdown(self) -> None:
        """Stop every instance and its process tree, and the zygotes; used when the launcher itself stops."""
        self.zygotes.stop()
        instances = list(self._instances.values())
        await asyncio.gather(*(self._stop(i) for i in instances))
        await asyncio.gather(*(_copied(i) for i in instances))
        for instance in instances:
            _remove_files(instance)
        for task in self._tasks:
            task.cancel()
        self.events.close_all()
        if self._session is not None:
            await self._session.close()

    # ----- plumbing

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    def _publish(self, instance: Instance, type_: EventType, exit_code: int | None = None) -> None:
        if not self.settings.dialect.publishes(type_):
            return
        instance.revision = self.events.next_revision()
        self.events.publish(type_, instance.state(), exit_code)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> "asyncio.Task[None]":
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


def _short_temp_dir() -> Path:
    root = tempfile.gettempdir()
    # mkdtemp adds 8 random characters to the prefix.
    if len(root) + len(TEMP_DIR_PREFIX) + 8 + IPC_NAME_CHARS + 2 > MAX_IPC_PATH_CHARS:
        root = "/tmp"
    return Path(tempfile.mkdtemp(prefix=TEMP_DIR_PREFIX, dir=root))


async def _copied(instance: Instance) -> None:
    """Until the instance's output is on the launcher's stdout, its last lines included (it has exited).
    The copy is shielded: a waiter that gives up (or is cancelled) leaves it running; a copy cancelled
    itself (the launcher's shutdown) ends the wait, while a cancellation of the waiter goes on up."""
    if instance.output is not None:
        try:
            async with asyncio.timeout(OUTPUT_DRAIN_S):
                await asyncio.shield(instance.output)
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            if not instance.output.cancelled():
                raise


def _remove_files(instance: Instance) -> None:
    shutil.rmtree(instance.work_dir, ignore_errors=True)
    shutil.rmtree(instance.temp_dir, ignore_errors=True)
