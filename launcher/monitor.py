"""One forked instance's supervision, from its fork until it stops, and the state its watches own.

After the fork the instance's monitor (`Monitor.run`) waits for its server's first answer to /health
(the move to AWAKE), then runs the instance's watches in a TaskGroup until it stops: the recording of
its post-wake probe (`wake_verification`), its liveness (`liveness`) and its sleep state. What those
watches know that is not the instance's phase (whether its last /health failed, whether a look at its
sleep state is asked) is the monitor's, not the instance's.

The monitor is the one place the launcher learns of sleeps and wakes asked of an instance's server
directly (vLLM's own /sleep and /wake_up, which FMA's controllers use), rather than through the
launcher. The server reports each before it answers (`sleep_reports`, `Monitor.reported`), and the
sleep-state watch asks its /is_sleeping every liveness interval besides (for what a report missed). A
sleep is recorded at once (ASLEEP, a SLEEPING event), also one reported before the launcher's own
/health poll saw the server ready (a client that polls the server's /health itself, as FMA's
controller does, may sleep it at once: READY is recorded first). A wake is checked first
(`wake_verification`) and recorded (AWAKE) only when it passes; one that fails is killed. Not looked at:
an instance whose lock is held (the launcher's own sleep or wake records what it did; the recording of
the first ready's probe holds it too, but does not stop a look), one being stopped, and one whose
/health fails (its liveness check is on it).

A read of the launcher (an instance, or the list) returns what was recorded: it neither asks the
server, nor waits for a look, nor changes anything.
"""

import asyncio
import contextlib
import time
from dataclasses import dataclass

from api.launcher import WakeCheckStatus

from . import liveness, startup_phases
from .errors import BackendError, WakeCheckFailed
from .instance import Instance, InstanceExited
from .instance_server import InstanceServers
from .lifecycle import Phase
from .liveness import EngineProcesses, LivenessPolicy
from .metrics import LauncherMetrics
from .runtimes import Runtime
from .stopping import Stopper
from .wake_verification import WakeVerifier


@dataclass(frozen=True)
class Supervision:
    """What every instance's monitor uses: the launcher's client of the servers, its post-wake check, its stopper."""

    servers: InstanceServers
    verifier: WakeVerifier
    stopper: Stopper
    metrics: LauncherMetrics
    liveness: LivenessPolicy


class Monitor:
    """One forked instance's watches, and what they know of it besides its phase."""

    def __init__(self, instance: Instance, runtime: Runtime, supervision: Supervision) -> None:
        self.instance = instance
        self.runtime = runtime
        self.parts = supervision
        self.look_asked = asyncio.Event()  # by a wake its server reported, which the sleep-state watch checks
        self.health_failing = False  # its last /health probe failed

    async def run(self) -> None:
        """The instance's life after the fork: until it is first ready, then its watches until it stops."""
        instance = self.instance
        if not await self.parts.servers.first_health(instance) or not instance.running:
            return  # it stopped first
        if instance.phase is Phase.STARTING:  # else a sleep its server reported found it ready first
            self._on_ready()
        engine = EngineProcesses.find(instance.pid, self.runtime.is_engine_process)
        try:
            async with asyncio.TaskGroup() as watches:
                if instance.wake_check.status is WakeCheckStatus.PENDING:
                    watches.create_task(self.parts.verifier.record(instance, self.runtime))
                if engine is None:
                    return  # its server is already gone; the reaper reports it
                if engine.engine:
                    instance.log.info(
                        "instance %s: watching its engine processes %s", instance.id, ", ".join(engine.titles)
                    )
                watches.create_task(self._watch_liveness(engine))
                watches.create_task(instance.end.while_running(self.watch_sleep()))
        except* InstanceExited:
            pass  # it stopped: its watches are over

    def _on_ready(self) -> None:
        instance, metrics = self.instance, self.parts.metrics
        ready_at = time.monotonic()
        elapsed = ready_at - instance.created_at
        metrics.ready_seconds.observe(elapsed)
        phases = startup_phases.startup_phases(
            instance.created_at, startup_phases.read_marks(instance.marks_path), ready_at
        )
        instance.startup.phases, instance.startup.total_seconds = phases, round(elapsed, 6)
        for phase, seconds in phases.items():
            metrics.startup_phase_seconds.labels(phase, instance.runtime_name).observe(seconds)
        instance.log.info(
            "instance %s is ready after %.2f s: %s", instance.id, elapsed,
            ", ".join(f"{phase} {seconds:.3f} s" for phase, seconds in phases.items()),
        )  # fmt: skip
        instance.move(Phase.AWAKE)

    async def _watch_liveness(self, engine: EngineProcesses) -> None:
        verdict = await self.instance.end.while_running(liveness.watch(engine, self._probe_health, self.parts.liveness))
        if verdict is not None:
            self.parts.stopper.kill(self.instance, verdict)

    async def _probe_health(self) -> str | None:
        """One liveness probe of the instance's /health: None when it answered 200, else what went wrong."""
        problem = await self.parts.servers.health(self.instance, self.parts.liveness.health_timeout_s)
        self.health_failing = problem is not None
        return problem

    # ----- the sleep state

    def _lookable(self) -> bool:
        instance = self.instance
        return (
            instance.ready
            and instance.running
            and not instance.end.stop_asked
            and (not instance.lock.locked() or self.parts.verifier.recording(instance))
            and not self.health_failing
        )

    def reported(self, sleeping: bool) -> None:
        """Its server's word, just before it answers a sleep or a wake, that it sleeps now, or not: a sleep is
        recorded at once (so the client's next read of the launcher sees it), a wake is left to the sleep-state
        watch, which checks it first."""
        instance = self.instance
        if sleeping and instance.phase is Phase.STARTING and instance.running and not instance.end.stop_asked:
            self._on_ready()  # it answered a sleep, so it is up: before the launcher's own /health poll saw it
        if not self._lookable() or sleeping == instance.sleeping:
            return
        if sleeping:
            instance.move(Phase.ASLEEP)
        else:
            self.look_asked.set()

    async def watch_sleep(self) -> None:
        """Until the instance stops: look every interval, and at once when its server reported a wake."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.parts.liveness.health_interval_s):
                    await self.look_asked.wait()
            self.look_asked.clear()
            if await self._look():
                await self._verify_wake()

    async def _look(self) -> bool:
        """Ask the server; record a sleep it reports. True when it reports a wake, which is still to be checked."""
        if not self._lookable():
            return False
        sleeping = await self.parts.servers.is_sleeping(self.instance)
        if sleeping is None or sleeping == self.instance.sleeping or not self._lookable():
            return False
        if sleeping:
            self.instance.move(Phase.ASLEEP)
            return False
        return True

    async def _verify_wake(self) -> None:
        instance = self.instance
        async with instance.lock:
            if not (instance.running and instance.sleeping):
                return  # stopped, or woken by the launcher meanwhile
            try:
                await self.parts.verifier.check(instance, self.runtime)
            except (WakeCheckFailed, BackendError):
                return  # killed, or stopped meanwhile: its STOPPED event says so
            if instance.running:  # else it stopped as it answered
                instance.move(Phase.AWAKE)
