"""Liveness of what an instance serves, watched from its first ready on until it stops.

Two signs that an instance no longer serves, whichever comes first:
- **A process it needs died** (vLLM's engine core, which vLLM forks): the processes the runtime calls
  its engine, found when the instance first became ready, are watched through pidfds (the kernel
  says when each exits, at once), or polled where pidfds are not available. The server process
  itself is not among them: the launcher is its parent and learns of its exit from SIGCHLD. vLLM's
  server usually exits soon after its engine dies, but not always (it can stay up, wedged, still
  answering nothing), so the launcher does not wait for it.
- **Its /health stops answering**: probed every `health_interval_s` with a `health_timeout_s`
  timeout; `failure_threshold` failures in a row (a timeout, a refused connection, a status other
  than 200) make it unresponsive. A server sleeping, being put to sleep or woken still answers
  /health (vLLM, the transformers runtime and the stand-in all serve it from a loop that the
  transition does not block), so none of those is a failure.

The verdict is the caller's to act on (it kills the instance's process group and reports why).
"""

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import psutil

from api.launcher import StopReason
from api.tasks import first_to_finish

log = logging.getLogger(__name__)

# Where pidfds are not available: how often the engine processes are looked at.
POLL_S = 0.1


@dataclass(frozen=True)
class LivenessPolicy:
    """When an instance counts as unresponsive; the defaults detect a hung instance within about
    interval + threshold x timeout = 8 s."""

    health_interval_s: float = 2.0
    health_timeout_s: float = 2.0
    failure_threshold: int = 3

    def __post_init__(self) -> None:
        if self.health_interval_s <= 0 or self.health_timeout_s <= 0 or self.failure_threshold < 1:
            raise ValueError(f"invalid liveness policy {self}: times must be positive, the threshold at least 1")


@dataclass(frozen=True)
class Verdict:
    """Why an instance is judged dead, and what was seen."""

    reason: StopReason
    message: str


def _alive(process: psutil.Process) -> bool:
    """Running and not a zombie (a dead child its parent has not reaped yet); False once its PID was reused."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _title(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline()).strip()
    except psutil.Error:
        return ""


@dataclass(frozen=True)
class EngineProcesses:
    """The server process of an instance and the processes of its tree that it cannot serve without."""

    server: psutil.Process
    engine: tuple[psutil.Process, ...]
    titles: tuple[str, ...]

    @classmethod
    def find(cls, pid: int, is_engine: Callable[[str], bool]) -> "EngineProcesses | None":
        """The server `pid`'s descendants whose process title `is_engine` accepts; None if it is gone."""
        try:
            server = psutil.Process(pid)
            descendants = server.children(recursive=True)
        except psutil.Error:
            return None
        engine = [(p, title) for p in descendants if is_engine(title := _title(p))]
        return cls(server, tuple(p for p, _ in engine), tuple(title for _, title in engine))

    def first_dead(self) -> str | None:
        """A description of an engine process that died, if one did."""
        for process, title in zip(self.engine, self.titles, strict=True):
            if not _alive(process):
                return f"process {process.pid} ({title})"
        return None

    def server_alive(self) -> bool:
        return _alive(self.server)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _engine_death(processes: EngineProcesses) -> Verdict | None:
    """Returns when an engine process dies while the server lives (None when the server died first:
    that is an exit, which SIGCHLD reports); never, while all live."""
    loop = asyncio.get_running_loop()
    died: asyncio.Future[None] = loop.create_future()
    fds: list[int] = []
    try:
        for process in processes.engine:
            try:
                fd = os.pidfd_open(process.pid)
            except OSError:  # no pidfds here (an old kernel, a seccomp profile), or the process is gone
                break
            fds.append(fd)
            loop.add_reader(fd, _settle, died)
        else:
            if processes.first_dead() is None:  # none exited before its pidfd was opened
                await died
        while (dead := processes.first_dead()) is None:  # noqa: ASYNC110 - a poll where no pidfd tells us
            await asyncio.sleep(POLL_S)
    finally:
        for fd in fds:
            loop.remove_reader(fd)
            os.close(fd)
    if not processes.server_alive():
        return None
    return Verdict(StopReason.ENGINE_DIED, f"{dead} of its process tree died")


async def _unresponsive(probe: Callable[[], Awaitable[str | None]], policy: LivenessPolicy) -> Verdict:
    """Returns when /health failed `failure_threshold` times in a row. `probe` answers None when
    healthy, else what went wrong, within the policy's timeout."""
    loop = asyncio.get_running_loop()
    failures = 0
    while True:
        started = loop.time()
        problem = await probe()
        if problem is None:
            failures = 0
        else:
            failures += 1
            log.info("health probe failed (%d of %d): %s", failures, policy.failure_threshold, problem)
            if failures >= policy.failure_threshold:
                return Verdict(
                    StopReason.UNRESPONSIVE,
                    f"/health failed {failures} times in a row, {policy.health_interval_s:g} s apart; last: {problem}",
                )
        await asyncio.sleep(max(0.0, policy.health_interval_s - (loop.time() - started)))


async def watch(
    processes: EngineProcesses, probe: Callable[[], Awaitable[str | None]], policy: LivenessPolicy
) -> Verdict | None:
    """Until the instance is judged dead (its verdict) or its server died by itself (None). The
    caller cancels it when the instance stops for another reason."""
    return await first_to_finish(_engine_death(processes), _unresponsive(probe, policy))
