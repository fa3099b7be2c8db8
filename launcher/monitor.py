"""One forked instance's supervision, from its fork until it stops, and the state its watches own.

After the fork the instance's monitor (`Monitor.run`) waits for its server's first answer to /health
(the move to AWAKE), then runs the instance's watches in a TaskGroup until it stops: the recording of
its post-wake probe (`wake_verification`), its liveness (`liveness`) and its sleep state. What those
watches know that is not the instance's phase (whether its last /health failed, the reads waiting for a
look) is the monitor's, not the instance's.

The sleep-state watch is the one place the launcher discovers sleeps and wakes asked of an instance's
server directly (vLLM's own /sleep and /wake_up, which FMA's controllers use), rather than through the
launcher. It asks the server's /is_sleeping every liveness interval: a sleep found is recorded at once
(ASLEEP, a SLEEPING event); a wake found is checked first (`wake_verification`) and recorded (AWAKE)
only when it passes; one that fails is killed. Not looked at: an instance whose lock is held (the
launcher's own sleep or wake records what it did), one being stopped, and one whose /health fails (its
liveness check is on it).

A read of the launcher (an instance, or the list) asks the watch to look now and waits for that look, at
most `LOOK_WAIT_S`, so it sees a sleep asked a moment ago. That holds from the server's first answer: a
client that polls the server's /health itself (FMA's controller does) may put it to sleep before the
launcher has seen it ready; a read then finds the server answering, waits for the watch to start, and has
it look. The recording of the post-wake probe at the first ready holds the instance's lock but does not
stop a look (only the launcher's own sleeps and wakes do). The read itself changes nothing: it neither
checks a wake nor kills; the watch does, after the read has its answer.
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

LOOK_WAIT_S = 2.0  # the most a read waits for the look it asked for


@dataclass(frozen=True)
class Supervision:
    """What every instance's monitor uses: the launcher's client of the servers, its post-wake check, its stopper."""

    servers: InstanceServers
    verifier: WakeVerifier
    stopper: Stopper
    metrics: LauncherMetrics
    liveness: LivenessPolicy


class LookRequests:
    """The reads waiting for the next look at one instance's sleep state."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.coming = True  # its watch starts at its first ready, unless the instance stops first
        self.watching = asyncio.Event()  # set while its watch runs
        self._waiting: list[asyncio.Future[None]] = []

    @property
    def watched(self) -> bool:
        return self.watching.is_set()

    async def watch_started(self) -> None:
        """Until the watch runs, at most LOOK_WAIT_S."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(LOOK_WAIT_S):
                await self.watching.wait()

    async def wait_for_look(self) -> None:
        answered = asyncio.get_running_loop().create_future()
        self._waiting.append(answered)
        self.asked.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(LOOK_WAIT_S):
                await answered

    def take(self) -> list[asyncio.Future[None]]:
        """The reads the next look answers."""
        self.asked.clear()
        waiting, self._waiting = self._waiting, []
        return waiting

    def answer(self, waiting: list[asyncio.Future[None]]) -> None:
        for each in waiting:
            if not each.done():  # a read that gave up
                each.set_result(None)


class Monitor:
    """One forked instance's watches, and what they know of it besides its phase."""

    def __init__(self, instance: Instance, runtime: Runtime, supervision: Supervision) -> None:
        self.instance = instance
        self.runtime = runtime
        self.parts = supervision
        self.looks = LookRequests()
        self.health_failing = False  # its last /health probe failed

    async def run(self) -> None:
        """The instance's life after the fork: until it is first ready, then its watches until it stops."""
        try:
            await self._watch_from_first_ready()
        finally:
            self.looks.coming = False  # also where it stopped before its sleep-state watch began

    async def _watch_from_first_ready(self) -> None:
        instance = self.instance
        if not await self.parts.servers.first_health(instance) or not instance.running:
            return  # it stopped first
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
                watches.create_task(instance.while_running(self.watch_sleep()))
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
        verdict = await self.instance.while_running(liveness.watch(engine, self._probe_health, self.parts.liveness))
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
            and not instance.stopping
            and (not instance.lock.locked() or self.parts.verifier.recording(instance))
            and not self.health_failing
        )

    async def look_now(self) -> None:
        """For a read: until the watch has looked at the instance's sleep state (at once where it does not look).
        An instance whose watch is still to come is waited for once its server answers /health."""
        instance, looks = self.instance, self.looks
        if (
            looks.coming
            and instance.running
            and not instance.stopping
            and (instance.ready or await self.parts.servers.health(instance, LOOK_WAIT_S) is None)
        ):
            await looks.watch_started()
        if looks.watched and self._lookable():
            await looks.wait_for_look()

    async def watch_sleep(self) -> None:
        """Until the instance stops: look every interval, and whenever a read asks."""
        looks = self.looks
        looks.coming = False
        looks.watching.set()
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.parts.liveness.health_interval_s):
                        await looks.asked.wait()
                waiting = looks.take()
                try:
                    woken = await self._look()
                finally:
                    looks.answer(waiting)
                if woken:
                    await self._verify_wake()
        finally:
            looks.watching.clear()
            looks.answer(looks.take())

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
