"""What puts an admitted instance's server into the world and watches it: the seam between the instance manager
(admission, the instances held, sleeps, wakes, deletions) and the processes behind the instances.

The launcher's `ProcessForker` forks each server from its runtime's zygote (or from the launcher), learns its exit
from the reaper and its sleeps from its reports (`sleep_reports`), copies its output to the launcher's stdout and
supervises it (`monitor`). A simulation injects its own `Forker`, whose instances have no process.
"""

import asyncio
import shlex
import signal
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from api.launcher import StartupTimes

from . import output_relay, process_control, startup_phases
from .admission import Admission
from .fork import InstanceSpec
from .instance import LOG_FILE, Instance
from .metrics import LauncherMetrics, ZygoteSample
from .monitor import Monitor, Supervision
from .process_stats import ProcessTreeStats
from .runtimes import Runtime
from .sleep_reports import SleepReports
from .zygote import Zygote, Zygotes

# vLLM binds ZMQ IPC sockets named by a 36-character UUID inside TMPDIR, and zmq refuses socket paths
# near the 107-byte sun_path limit; an instance's TMPDIR therefore lives in a short directory.
MAX_IPC_PATH_CHARS = 100
IPC_NAME_CHARS = 36
TEMP_DIR_PREFIX = "dualpods-"

Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]  # a task the manager holds and cancels at its end


@dataclass(frozen=True)
class Forked:
    """An instance's server just started: what the manager records of it."""

    pid: int
    temp_dir: Path
    stats: ProcessTreeStats
    startup: StartupTimes
    checks_wakes: bool  # whether its wakes can be checked at all (a server with no process cannot be probed)


class Forker(Protocol):
    """What the instance manager asks of whatever runs its instances' servers."""

    def start(self) -> None:
        """Get ready to fork (on the event loop, at the launcher's start, before it serves)."""

    def fork(self, admitted: Admission, work_dir: Path) -> Forked:
        """Start the admitted instance's server, its files in `work_dir`; nothing here may await (the create's
        checks must not be raced)."""

    def supervise(self, instance: Instance, runtime: Runtime, spawn: Spawn) -> None:
        """Watch the started instance (through tasks `spawn` makes) until it stops: at least its move to AWAKE once
        it is first ready."""

    def stop(self) -> None:
        """Stop forking (at the launcher's shutdown, after which no instance is created)."""


class ProcessForker:
    """Forks instances' servers as processes, and supervises each (`monitor`)."""

    def __init__(
        self,
        runtimes: dict[str, Runtime],
        metrics: LauncherMetrics,
        supervision: Supervision,
        on_exit: Callable[[Instance, int], None],  # the reaper's word that an instance's server exited
        zygotes: bool,  # fork from each runtime's zygote, else from the launcher
    ) -> None:
        self.metrics = metrics
        self.supervision = supervision
        self.on_exit = on_exit
        self.reaper = process_control.ChildReaper()
        distinct = {id(r): r for r in runtimes.values()}.values() if zygotes else ()
        self.zygotes = Zygotes(Zygote(r, self.reaper, metrics.zygote_restarts.labels(r.name).inc) for r in distinct)
        metrics.sample_zygotes_with(
            lambda: [ZygoteSample(z.runtime.name, z.ready, z.memory()) for z in self.zygotes.all]
        )
        self.sleep_reports = SleepReports()
        self._monitors: dict[int, Monitor] = {}  # by the PID of the instance's server

    def start(self) -> None:
        """Start every runtime's zygote and wait until they are ready; from then on, reap exited children and
        read the servers' sleep reports."""
        self.zygotes.start()
        asyncio.get_running_loop().add_signal_handler(signal.SIGCHLD, self.reaper.reap)
        self.sleep_reports.start(self._reported)

    def stop(self) -> None:
        self.zygotes.stop()
        self.sleep_reports.close()

    def fork(self, admitted: Admission, work_dir: Path) -> Forked:
        runtime = admitted.runtime
        temp_dir = _short_temp_dir()
        spec = InstanceSpec(
            argv=admitted.argv,
            env={**runtime.child_environment(), "TMPDIR": str(temp_dir), **admitted.env},
            log_path=str(work_dir / LOG_FILE),
            marks_path=str(work_dir / startup_phases.MARKS_FILE),
            title=f"dualpods-instance {admitted.instance_id}",
            sleep_reports=self.sleep_reports.address,
        )
        started = time.monotonic()
        pid, forked_by = self.zygotes.fork(runtime, spec)
        self.metrics.fork_seconds.observe(time.monotonic() - started)
        self.metrics.forks.labels(runtime.name, forked_by).inc()
        return Forked(pid, temp_dir, ProcessTreeStats(pid), StartupTimes(forked_by=forked_by), checks_wakes=True)

    def supervise(self, instance: Instance, runtime: Runtime, spawn: Spawn) -> None:
        instance.log.info(
            "created instance %s (pid %d, port %d, forked by the %s): %s; defaults added: %s",
            instance.id, instance.pid, instance.port, instance.startup.forked_by, shlex.join(instance.argv),
            instance.defaults_applied or "none",
        )  # fmt: skip
        self.reaper.watch(instance.pid, lambda code: self._exited(instance, code))
        instance.output = spawn(output_relay.follow(instance.log_path, instance.id, instance.end))
        monitor = self._monitors[instance.pid] = Monitor(instance, runtime, self.supervision)
        spawn(monitor.run())

    def _reported(self, pid: int, sleeping: bool) -> None:
        monitor = self._monitors.get(pid)
        if monitor is not None:  # else not an instance's server, or one that exited
            monitor.reported(sleeping)

    def _exited(self, instance: Instance, exit_code: int) -> None:
        self._monitors.pop(instance.pid, None)
        # The engine core may outlive the server process it belonged to.
        process_control.signal_group(instance.pid, signal.SIGKILL)
        self.on_exit(instance, exit_code)


def _short_temp_dir() -> Path:
    root = tempfile.gettempdir()
    # mkdtemp adds 8 random characters to the prefix.
    if len(root) + len(TEMP_DIR_PREFIX) + 8 + IPC_NAME_CHARS + 2 > MAX_IPC_PATH_CHARS:
        root = "/tmp"
    return Path(tempfile.mkdtemp(prefix=TEMP_DIR_PREFIX, dir=root))
