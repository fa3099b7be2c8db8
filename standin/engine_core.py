"""The stand-in's engine process: a child the API server cannot generate without, as vLLM's EngineCore.

vLLM's API server forks an engine-core process and hands it every request over a socket. When that
process dies the server usually exits, but not always: it can stay up, wedged, still answering
`/health` while every completion fails. The stand-in reproduces that bad case on purpose, so the
launcher's engine watch (`launcher/liveness.py`) is what must catch it:

- `start` forks the engine before the API server listens (vLLM's engine is up before its port
  opens). The engine titles itself `ENGINE_TITLE` (`standin::EngineCore`, as vLLM's `VLLM::EngineCore`),
  by which a launcher knows it, then says it is ready.
- Each inference request is one round trip to the engine (a line out, the same line back).
- When the engine dies (its end of the socket closes), every inference request from then on, and
  every one waiting on it, fails with 500 (vLLM's EngineDeadError); `/health` and every other route
  keep answering 200. The server never exits for it.
- The engine ignores SIGTERM and SIGINT and ends after its server does, so neither a graceful stop of
  the server's process group nor the server's own death is mistaken for an engine death.
"""

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import time

from api.openai_errors import ApiError

log = logging.getLogger("standin")

ENGINE_TITLE = "standin::EngineCore"
_READY = b"ready\n"
PARENT_POLL_S = 0.01  # how often an engine whose server closed its end looks whether the server is gone


def _set_title(title: str) -> None:
    """Title the process as a launcher looks for it; setproctitle comes with the launcher's extras, and a
    stand-in run alone without it keeps its engine untitled."""
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(title)


def _engine_main(sock: socket.socket) -> None:
    """The engine process: answer each request line with itself until the server's end closes, then end
    once the server has exited (no longer its parent). A server's sockets close early in its exit, so an
    engine that ended at once could be seen dead while its server still looked alive: a dying server
    would be taken for a wedged one."""
    server = os.getppid()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
    _set_title(ENGINE_TITLE)
    with contextlib.suppress(OSError), sock.makefile("rb") as requests:
        sock.sendall(_READY)
        for line in requests:
            sock.sendall(line)
    while os.getppid() == server:
        time.sleep(PARENT_POLL_S)


class EngineCore:
    """The API server's end of its engine process."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self._sock = sock
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future[None]] = {}
        self._ids = itertools.count()
        self._reading: asyncio.Task[None] | None = None
        self.dead = False

    @classmethod
    def start(cls) -> "EngineCore":
        """Fork the engine and wait until it is titled and ready. Call before any event loop runs."""
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            exit_code = 1
            try:
                ours.close()
                _engine_main(theirs)
                exit_code = 0
            finally:
                os._exit(exit_code)
        theirs.close()
        with ours.makefile("rb") as greeting:
            if greeting.readline() != _READY:
                raise RuntimeError(f"the engine process {pid} died while starting")
        log.info("engine process %d (%s) is ready", pid, ENGINE_TITLE)
        return cls(pid, ours)

    async def connect(self) -> None:
        """Attach to the running event loop; from now on a dead engine is noticed at once."""
        reader, self._writer = await asyncio.open_unix_connection(sock=self._sock)
        self._reading = asyncio.create_task(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while line := await reader.readline():
            if (waiting := self._pending.pop(int(line), None)) is not None and not waiting.done():
                waiting.set_result(None)
        self._died()

    def _died(self) -> None:
        if self.dead:
            return
        self.dead = True
        log.error(
            "engine process %d died; this server stays up but can no longer generate (every inference "
            "request fails with 500), as vLLM's can after its EngineCore dies",
            self.pid,
        )
        for waiting in self._pending.values():
            if not waiting.done():
                waiting.set_exception(self._dead_error())
        self._pending.clear()

    def _dead_error(self) -> ApiError:
        return ApiError(
            500,
            f"EngineCore (process {self.pid}) died; this server can no longer generate.",
            err_type="InternalServerError",
        )

    async def step(self) -> None:
        """One request's round trip through the engine; ApiError 500 when the engine is dead."""
        if self.dead or self._writer is None:
            raise self._dead_error()
        request = next(self._ids)
        answered = asyncio.get_running_loop().create_future()
        self._pending[request] = answered
        try:
            self._writer.write(f"{request}\n".encode())
            await self._writer.drain()
        except OSError:
            self._pending.pop(request, None)
            self._died()
            raise self._dead_error() from None
        await answered

    async def close(self) -> None:
        """Close the server's end (the engine then exits)."""
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reading
        if self._writer is not None:
            self._writer.close()
        else:
            self._sock.close()
