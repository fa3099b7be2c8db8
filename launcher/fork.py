"""Fork an instance (from the launcher or from its runtime's zygote) and turn it into a model server.

The child is a fresh session (its own process group, so the launcher can stop its whole tree),
closes what it inherited (the launcher's event loop and sockets, a zygote's control socket), writes
to its own log file, marks its start-up phases (`startup_phases`), reports its sleeps and wakes
(`sleep_reports`), and never returns into the
launcher's code: it ends with os._exit.
"""

import asyncio
import gc
import os
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

import setproctitle

from . import process_control, sleep_reports, startup_phases
from .runtimes import Runtime


@dataclass(frozen=True)
class InstanceSpec:
    """What a forked child needs to become an instance; plain data, so it can be sent to a zygote."""

    argv: list[str]
    env: dict[str, str]
    log_path: str
    marks_path: str
    title: str
    sleep_reports: str  # where its server reports whether it sleeps (`sleep_reports`)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> "InstanceSpec":
        return cls(
            list(raw["argv"]), dict(raw["env"]), str(raw["log_path"]), str(raw["marks_path"]), str(raw["title"]),
            str(raw["sleep_reports"]),
        )  # fmt: skip


def fork_child(body: Callable[[], None]) -> int:
    """Fork; the child runs `body` with the launcher's signal handling undone and exits with os._exit.

    Until the child has dropped the launcher's signal handling, a signal sent to it would run the
    launcher's handler and reach the launcher's event loop through the inherited wakeup descriptor
    (a SIGTERM for a just-created instance would stop the launcher). Blocked signals wait instead."""
    sys.stdout.flush()
    sys.stderr.flush()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, process_control.HANDLED_SIGNALS)
    pid = os.fork()
    if pid != 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return pid

    def undo_launcher_then_run() -> None:
        process_control.reset_signals()
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        asyncio.set_event_loop(None)  # the launcher's loop is not ours to run
        body()

    run_then_exit(undo_launcher_then_run)


def run_then_exit(body: Callable[[], None]) -> NoReturn:
    """In a forked child: run `body`, then leave with os._exit (its exit status, 1 on an exception), never
    returning into the code that forked it."""
    exit_code = 1
    try:
        body()
        exit_code = 0
    except SystemExit as done:
        exit_code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)


def freeze_heap() -> None:
    """Before forking instances: put every object alive now in the collector's permanent generation.

    A child's garbage collections then skip what it inherited: the hundreds of thousands of objects of
    the preloaded imports, which each full collection would otherwise walk (vLLM runs four while it
    starts, 0.4-1 s each on a loaded 2-core machine), writing into every page that holds one and so
    copying pages the child would otherwise share with its parent (an instance's own memory here: 558
    MiB before, 260 MiB after). Garbage made by the imports is collected first."""
    gc.collect()
    gc.freeze()


def fork_instance(runtime: Runtime, spec: InstanceSpec) -> int:
    """Start the instance from the launcher itself; return its PID, which is also its process-group ID."""
    return fork_child(lambda: serve_instance(runtime, spec))


def serve_instance(runtime: Runtime, spec: InstanceSpec) -> None:
    """In the forked child, a child of the launcher: become the instance and serve until told to stop."""
    _become_instance(spec, runtime.markers)
    runtime.report_sleeps(sleep_reports.reporter(spec.sleep_reports))
    runtime.serve(spec.argv)


def _become_instance(spec: InstanceSpec, markers: tuple[startup_phases.Marker, ...]) -> None:
    os.setsid()
    setproctitle.setproctitle(spec.title)
    process_control.die_with_parent()
    process_control.close_inherited_descriptors()
    log_fd = os.open(spec.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    os.environ.update(spec.env)
    tempfile.tempdir = None  # the launcher's cached temp dir would override the instance's TMPDIR
    startup_phases.record_marks(Path(spec.marks_path), markers)
