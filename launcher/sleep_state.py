"""The one place the launcher discovers sleeps and wakes asked of an instance's server directly (vLLM's own
/sleep and /wake_up, which FMA's controllers use), rather than through the launcher.

From an instance's first ready until it stops, its watch (`SleepStates.watch`) asks the server's
/is_sleeping every liveness interval: a sleep found is recorded at once (ASLEEP, a SLEEPING event); a
wake found is checked first (`wake_verification`) and recorded (AWAKE) only when it passes; one that
fails is killed. Not looked at: an instance whose lock is held (the launcher's own sleep or wake records
what it did), one being stopped, and one whose /health fails (its liveness check is on it).

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
from typing import TYPE_CHECKING

from .errors import BackendError, WakeCheckFailed
from .lifecycle import Phase

if TYPE_CHECKING:
    from .instance import Instance
    from .instance_server import InstanceServers
    from .runtimes import Runtime
    from .wake_verification import WakeVerifier

LOOK_WAIT_S = 2.0  # the most a read waits for the look it asked for


class LookRequests:
    """The reads waiting for the next look at one instance's sleep state."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.coming = False  # its watch starts at its first ready (a forked server's; a simulated one has none)
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


def _lookable(instance: "Instance") -> bool:
    return (
        instance.ready
        and instance.running
        and not instance.stopping
        and (not instance.lock.locked() or instance.recording_probe)
        and not instance.health_failing
    )


class SleepStates:
    def __init__(self, servers: "InstanceServers", verifier: "WakeVerifier", interval_s: float) -> None:
        self.servers = servers
        self.verifier = verifier
        self.interval_s = interval_s

    async def look_now(self, instance: "Instance") -> None:
        """For a read: until the watch has looked at the instance's sleep state (at once where it does not look).
        An instance whose watch is still to come is waited for once its server answers /health."""
        looks = instance.looks
        if (
            looks.coming
            and instance.running
            and not instance.stopping
            and (instance.ready or await self.servers.health(instance, LOOK_WAIT_S) is None)
        ):
            await looks.watch_started()
        if looks.watched and _lookable(instance):
            await looks.wait_for_look()

    async def watch(self, instance: "Instance", runtime: "Runtime") -> None:
        """Until the instance stops: look every interval, and whenever a read asks."""
        looks = instance.looks
        looks.coming = False
        looks.watching.set()
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.interval_s):
                        await looks.asked.wait()
                waiting = looks.take()
                try:
                    woken = await self._look(instance)
                finally:
                    looks.answer(waiting)
                if woken:
                    await self._verify_wake(instance, runtime)
        finally:
            looks.watching.clear()
            looks.answer(looks.take())

    async def _look(self, instance: "Instance") -> bool:
        """Ask the server; record a sleep it reports. True when it reports a wake, which is still to be checked."""
        if not _lookable(instance):
            return False
        sleeping = await self.servers.is_sleeping(instance)
        if sleeping is None or sleeping == instance.sleeping or not _lookable(instance):
            return False
        if sleeping:
            instance.move(Phase.ASLEEP)
            return False
        return True

    async def _verify_wake(self, instance: "Instance", runtime: "Runtime") -> None:
        async with instance.lock:
            if not (instance.running and instance.sleeping):
                return  # stopped, or woken by the launcher meanwhile
            try:
                await self.verifier.check(instance, runtime)
            except (WakeCheckFailed, BackendError):
                return  # killed, or stopped meanwhile: its STOPPED event says so
            if instance.running:  # else it stopped as it answered
                instance.move(Phase.AWAKE)
