"""A pre-initialised child per runtime that the launcher's instances fork from (issue 16).

Why: a server forked from the launcher still imported some 400 modules on its way to serving (vLLM's
API routers, uvicorn's protocols, the engine core's quantisation and scheduler modules, ...), every
time. The zygote, forked from the launcher after its preload, imports them once
(`Runtime.prepare_zygote`), freezes its heap (`fork.freeze_heap`: its instances' garbage collections
skip what they inherit), then waits on a Unix socket pair for fork requests; its instances start
with them in memory (shared copy-on-write with the zygote).

An instance forked from the zygote is still the launcher's child: the zygote forks a short-lived
middle process, which forks the instance and exits at once, and the orphaned instance is re-parented
to the launcher, a child subreaper. The zygote answers with the instance's PID only after it has
reaped the middle process (whose exit re-parents the instance), so by then the instance is the
launcher's child, alive or a zombie only the launcher can reap. The instance waits until it is the
launcher's child, and only then asks for SIGKILL at its parent's death (the middle's exit would
otherwise fire it), starts its own session, and closes every socket it inherited (the zygote's
control socket too): from there on it is what an instance forked by the launcher is (`fork`), reaped on
SIGCHLD, its process group signalled, its engine watched through pidfds, its PID the server's own.

CUDA: nothing in the launcher or the zygote initialises CUDA. The preload's platform detection
uses NVML, which makes no CUDA context, and the zygote only imports modules and freezes its heap;
importing torch or vLLM calls no torch.cuda function. A CUDA context does not survive fork, so each
instance creates its own after the fork, as a server started from scratch does.

Failure: the zygote's death (killed, out of memory) reaches the launcher's reaper, and it is started
again, after a back-off when it keeps dying before it is ready. A create that finds no ready zygote
(starting, restarting, or not answering within FORK_TIMEOUT_S) forks its instance from the launcher
itself, as every instance was before zygotes: a create never waits for a zygote and never fails for
want of one. `--no-zygote` forks every instance that way.
"""

import asyncio
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

import psutil
import setproctitle

from . import process_control
from .fork import InstanceSpec, fork_child, fork_instance, freeze_heap, run_then_exit, serve_instance
from .runtimes import Runtime

log = logging.getLogger(__name__)

# For the zygote's answer to a fork request, which takes milliseconds. The launcher waits for it without
# serving (a create's checks and its insert must not be raced), so a hung zygote costs this once, then is killed.
FORK_TIMEOUT_S = 3.0
READY_TIMEOUT_S = 300.0  # the launcher's start waits this long for its zygotes at most
REPARENT_TIMEOUT_S = 10.0  # for a new instance to become the launcher's child
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
RESTART_BACKOFF_S = (0.0, 1.0, 2.0, 5.0, 10.0, 30.0)  # by deaths in a row before ready
TITLE_PREFIX = "dualpods-zygote"  # its process title, then the runtime's name (an instance's: dualpods-instance ID)
VIA_ZYGOTE, VIA_LAUNCHER = "zygote", "launcher"


class Zygote:
    """The launcher's handle on one runtime's zygote: start it, ask it to fork, restart it when it dies."""

    def __init__(self, runtime: Runtime, reaper: process_control.ChildReaper, on_restart: Callable[[], None]) -> None:
        self.runtime = runtime
        self._reaper = reaper
        self._on_restart = on_restart
        self.pid: int | None = None
        self.ready = False
        self._control: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # reads its ready message after a restart
        self._deaths_before_ready = 0
        self._stopped = False

    def start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        launcher_pid = os.getpid()
        pid = fork_child(lambda: _zygote_main(self.runtime, theirs, launcher_pid))
        theirs.close()
        self._control, self.pid, self.ready = ours, pid, False
        log.info("started the %s zygote (pid %d)", self.runtime.name, pid)
        self._reaper.watch(pid, self._on_exit)
        try:  # a restart: its ready message is read as it comes (at the launcher's start, `wait_ready` reads it)
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        if self._loop is not None:
            self._loop.add_reader(ours.fileno(), self._receive_ready, 0)

    def wait_ready(self, timeout_s: float) -> bool:
        """Block until the zygote said it is ready (at the launcher's start, before it serves)."""
        deadline = time.monotonic() + timeout_s
        while not self.ready and self._control is not None and time.monotonic() < deadline:
            self._receive_ready(min(0.5, max(deadline - time.monotonic(), 0.001)))
            self._reaper.reap()
        return self.ready

    def fork(self, spec: InstanceSpec) -> int | None:
        """The PID of the instance the zygote forked, None where it cannot (not ready, or broken: then
        it is killed, and restarted)."""
        if not self.ready:
            self._receive_ready(0)
        if not self.ready or self._control is None:
            return None
        try:
            self._control.settimeout(FORK_TIMEOUT_S)
            self._control.send(json.dumps({"fork": spec.to_json()}).encode())
            answer = json.loads(self._control.recv(MAX_MESSAGE_BYTES) or b'{"error": "it exited"}')
            pid = answer.get("pid")
            problem = None if isinstance(pid, int) else answer.get("error", f"it answered {answer!r}")
        except (OSError, ValueError, AttributeError) as err:
            pid, problem = None, repr(err)
        if isinstance(pid, int) and problem is None:
            return pid
        log.warning("the %s zygote could not fork (%s); killed, it is started again, and this instance forks "
                    "from the launcher", self.runtime.name, problem)  # fmt: skip
        self._kill()
        return None

    def memory(self) -> dict[str, int]:
        """RSS, USS and PSS of the zygote (USS: what it alone holds, PSS: its share of what it shares)."""
        if self.pid is None:
            return {}
        try:
            info = psutil.Process(self.pid).memory_full_info()
        except psutil.Error:
            return {}
        return {"rss": info.rss, "uss": info.uss, "pss": getattr(info, "pss", 0)}

    def stop(self) -> None:
        self._stopped = True
        self._kill()

    def _stop_reading(self) -> None:
        if self._loop is not None and self._control is not None:
            self._loop.remove_reader(self._control.fileno())
        self._loop = None

    def _kill(self) -> None:
        self.ready = False
        self._stop_reading()
        if self._control is not None:
            self._control.close()
            self._control = None
        if self.pid is not None:
            process_control.signal_group(self.pid, signal.SIGKILL, leader_unreaped=True)

    def _receive_ready(self, timeout_s: float) -> None:
        if self._control is None:
            return
        try:
            self._control.settimeout(max(timeout_s, 0.0))  # 0: a look, without waiting
            message = self._control.recv(MAX_MESSAGE_BYTES)
        except (BlockingIOError, TimeoutError):
            return
        except OSError:
            self._kill()
            return
        if message == b"":  # it exited; its reaping restarts it
            self._stop_reading()
            return
        if json.loads(message).get("ready"):
            self._stop_reading()  # from here on, only fork answers come, each read by the fork that asked
            self.ready = True
            self._deaths_before_ready = 0
            log.info("the %s zygote (pid %d) is ready", self.runtime.name, self.pid)

    def _on_exit(self, exit_code: int) -> None:
        was_ready = self.ready
        self.pid = None  # reaped: its PID may be another process's already
        self._kill()
        if self._stopped:
            return
        if not was_ready:
            self._deaths_before_ready += 1
        delay = RESTART_BACKOFF_S[min(self._deaths_before_ready, len(RESTART_BACKOFF_S) - 1)]
        log.warning("the %s zygote exited with %d; starting another in %.0f s (creates fork from the launcher "
                    "meanwhile)", self.runtime.name, exit_code, delay)  # fmt: skip
        self._on_restart()
        try:
            asyncio.get_running_loop().call_later(delay, self._restart)
        except RuntimeError:  # the launcher is still starting: no loop yet
            self._restart()

    def _restart(self) -> None:
        if not self._stopped and self.pid is None:
            self.start()


class Zygotes:
    """Every runtime's zygote, or none (`--no-zygote`); forks instances through them."""

    def __init__(self, zygotes: Iterable[Zygote]) -> None:
        self._by_runtime = {id(z.runtime): z for z in zygotes}

    @property
    def all(self) -> list[Zygote]:
        return list(self._by_runtime.values())

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        for zygote in self.all:
            zygote.start()
        deadline = time.monotonic() + timeout_s
        for zygote in self.all:
            if not zygote.wait_ready(max(deadline - time.monotonic(), 0.001)):
                log.warning("the %s zygote is not ready: instances fork from the launcher until it is",
                            zygote.runtime.name)  # fmt: skip

    def fork(self, runtime: Runtime, spec: InstanceSpec) -> tuple[int, str]:
        """Start an instance: from the runtime's zygote where it is ready, else from the launcher; its PID
        and which of the two forked it."""
        zygote = self._by_runtime.get(id(runtime))
        pid = zygote.fork(spec) if zygote is not None else None
        if pid is not None:
            return pid, VIA_ZYGOTE
        return fork_instance(runtime, spec), VIA_LAUNCHER

    def stop(self) -> None:
        for zygote in self.all:
            zygote.stop()


def _zygote_main(runtime: Runtime, control: socket.socket, launcher_pid: int) -> None:
    """The zygote's life: prepare once, then fork an instance per request until the launcher closes its end."""
    os.setsid()  # out of the launcher's process group: a signal meant for the launcher's group is not its
    setproctitle.setproctitle(f"{TITLE_PREFIX} {runtime.name}")
    process_control.die_with_parent(in_forks=False)
    process_control.close_inherited_descriptors(keep=frozenset({control.fileno()}))
    started = time.monotonic()
    runtime.prepare_zygote()
    freeze_heap()
    control.setblocking(True)
    control.send(json.dumps({"ready": True, "seconds": time.monotonic() - started}).encode())
    while True:
        message = control.recv(MAX_MESSAGE_BYTES)
        if not message:
            return  # the launcher closed its end: it is stopping
        answer: dict[str, Any]
        try:
            spec = InstanceSpec.from_json(json.loads(message)["fork"])
            answer = {"pid": _fork_orphan(runtime, spec, launcher_pid)}
        except (OSError, ValueError, KeyError, TypeError) as err:
            answer = {"error": repr(err)}
        control.send(json.dumps(answer).encode())


def _fork_orphan(runtime: Runtime, spec: InstanceSpec, launcher_pid: int) -> int:
    """Fork the instance through a middle process that exits at once; its PID, once it is the launcher's child."""
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:

        def fork_and_leave() -> None:
            os.close(read_end)
            middle_pid = os.getpid()
            pid = os.fork()
            if pid == 0:
                os.close(write_end)
                run_then_exit(lambda: _serve_as_launchers_child(runtime, spec, launcher_pid, middle_pid))
            os.write(write_end, str(pid).encode())

        run_then_exit(fork_and_leave)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        raw = answer.read()
    os.waitpid(middle, 0)  # its exit has re-parented the instance to the launcher
    return int(raw)


def _serve_as_launchers_child(runtime: Runtime, spec: InstanceSpec, launcher_pid: int, middle_pid: int) -> None:
    deadline = time.monotonic() + REPARENT_TIMEOUT_S
    while os.getppid() == middle_pid:
        if time.monotonic() > deadline:
            raise SystemExit(1)
        time.sleep(0.0002)
    if os.getppid() != launcher_pid:
        raise SystemExit(1)  # the launcher died meanwhile: nobody would reap or stop this instance
    serve_instance(runtime, spec)
