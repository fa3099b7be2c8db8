"""Fork an instance from the preloaded launcher and turn the child into a model server.

The child is a fresh session (its own process group, so the launcher can stop its whole tree),
closes what it inherited from the launcher's event loop, writes to its own log file, and never
returns into the launcher's code: it ends with os._exit.
"""

import asyncio
import os
import signal
import sys
import tempfile
import traceback
from pathlib import Path

import setproctitle

from . import process_control
from .runtimes import Runtime


def fork_instance(runtime: Runtime, argv: list[str], env: dict[str, str], log_path: Path, title: str) -> int:
    """Start the instance; return its PID, which is also its process-group ID."""
    sys.stdout.flush()
    sys.stderr.flush()
    # Until the child has dropped the launcher's signal handling, a signal sent to it would run the
    # launcher's handler and reach the launcher's event loop through the inherited wakeup descriptor
    # (a SIGTERM for a just-created instance would stop the launcher). Blocked signals wait instead.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, process_control.HANDLED_SIGNALS)
    pid = os.fork()
    if pid != 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return pid
    exit_code = 1
    try:
        process_control.reset_signals()
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        _become_instance(env, log_path, title)
        runtime.serve(argv)
        exit_code = 0
    except SystemExit as done:
        exit_code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)


def _become_instance(env: dict[str, str], log_path: Path, title: str) -> None:
    os.setsid()
    setproctitle.setproctitle(title)
    process_control.die_with_parent()
    process_control.close_inherited_descriptors()
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    os.environ.update(env)
    tempfile.tempdir = None  # the launcher's cached temp dir would override the instance's TMPDIR
    asyncio.set_event_loop(None)  # the launcher's loop is not ours to run
