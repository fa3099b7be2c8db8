"""Linux process plumbing that keeps forked instances from ever outliving the launcher.

The launcher is a child subreaper, so processes an instance forks (vLLM's engine core) come back
to it when the instance's main process dies, and it reaps every child itself: in a container it is
PID 1 and nobody else would. Each instance process (and everything it forks) is killed by the
kernel if its parent dies, so even a SIGKILLed launcher leaves nothing behind.
"""

import ctypes
import logging
import os
import signal
import stat
from collections.abc import Callable

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def become_subreaper() -> None:
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def die_with_parent(*, in_forks: bool = True) -> None:
    """Ask the kernel to SIGKILL this process when its parent exits, and with `in_forks` every process it
    forks when theirs does (a zygote leaves that out: its instances outlive the process that forks them)."""
    parent = os.getppid()
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)
    if in_forks:
        os.register_at_fork(after_in_child=lambda: _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL))


def close_inherited_descriptors(keep: frozenset[int] = frozenset()) -> None:
    """Close sockets (the API listener, client connections) and anonymous inodes (the parent's
    event loop, pidfds) inherited through fork, but those in `keep`; files and pipes stay."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd <= 2 or fd in keep:
            continue
        try:
            is_socket = stat.S_ISSOCK(os.fstat(fd).st_mode)
            is_anonymous = os.readlink(f"/proc/self/fd/{fd}").startswith("anon_inode:")
        except OSError:
            continue  # the descriptor listdir itself used, already closed
        if is_socket or is_anonymous:
            os.close(fd)


HANDLED_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD})


def reset_signals() -> None:
    """Undo the parent's event-loop signal handling in a freshly forked child."""
    signal.set_wakeup_fd(-1)
    for signum in HANDLED_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)


def signal_process(pid: int, signum: int) -> bool:
    """Signal one process (an instance's server, not yet reaped, so its PID is still its own); False when it is
    gone."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True


def signal_group(pgid: int, signum: int, *, leader_unreaped: bool = False) -> bool:
    """Signal a process group; False when it no longer exists. With `leader_unreaped` (the caller's
    child, not reaped yet, so its PID cannot have been reused), the leader alone while it has not made
    the group yet: a child just forked, before its setsid, has forked nothing yet."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        if not leader_unreaped:
            return False
        return signal_process(pgid, signum)
    return True


class ChildReaper:
    """Reaps every child on SIGCHLD and hands the exit codes of watched ones to their callback.

    Exit codes follow multiprocessing: the status for a normal exit, -N for death by signal N.
    """

    def __init__(self) -> None:
        self._callbacks: dict[int, Callable[[int], None]] = {}

    def watch(self, pid: int, on_exit: Callable[[int], None]) -> None:
        self._callbacks[pid] = on_exit
        self.reap()  # it may have exited before we started watching

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            callback = self._callbacks.pop(pid, None)
            if callback is None:
                log.debug("reaped orphaned descendant %d", pid)
            else:
                callback(os.waitstatus_to_exitcode(status))
