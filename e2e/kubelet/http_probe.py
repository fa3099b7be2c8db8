"""The HTTP GET of httpGet probes and preStop hooks: HTTP/1.1 on a plain asyncio protocol, no client library.

One loopback kubelet process probes every Pod of every Node it plays: 2,000 Pods at scale make about 450
probes a second, and aiohttp's client spent ~120 us of CPU on each (this one ~30 us, on a connection kept
open). A probe is judged as a kubelet judges it: a status of 200-399 within the probe's timeout succeeds,
anything else fails; redirects are not followed; the body is read only to frame the answer (nothing reads
it); HTTPS is not verified.

Two things differ from a real kubelet, both because one process plays hundreds of them:
- `keep_alive`: a probe of a simulated container keeps its connection for the next probe (one socket per
  probe and Pod instead of a new connection each period, as a real kubelet opens). Real processes get a
  new connection per probe, as from a real kubelet. So do simulated ones beyond `KEPT_CONNECTIONS`: one
  process may hold no more than its open-files limit (20,000 here), and 5,000 Nodes' Pods have more probes.
- The deadline is the probe's timeout from its start (connecting included), counting only the time the
  prober was on time. One process probes for hundreds of Nodes, so on a loaded machine its loop runs late,
  and a connection made or an answer that arrived meanwhile waits in callbacks behind the deadline's timer
  (with aiohttp's client, and with `asyncio.timeout` around the connection, the deadline came first and
  such a probe failed: at 5,000 launchers, 912 liveness failures of 918 were connections the kernel had made
  on time, and restarting their launchers loaded the machine further). A deadline is put off by how late
  the loop ran while it was pending (`_Deadline`, `_Lateness`; up to `MAX_OWED_S` in all); one whose loop
  ran on time fails the probe, as a server that has not answered by then should.
"""

import asyncio
import functools
import resource
import ssl
import weakref
from collections.abc import Callable
from dataclasses import dataclass

MAX_HEAD_BYTES = 64 * 1024  # status line and headers; more is not an HTTP server's answer to a probe
# A loop this late while a deadline was pending held up the prober itself, not the server.
ON_TIME_S = 0.02
TICK_S = 0.05  # how often the loop's lateness is sampled
# At most this much time is added to a probe's timeout for the prober's lateness (a hung server still fails).
MAX_OWED_S = 10.0


class ConnectionBudget:
    """How many probe connections may stay open between periods, across every probe of the process."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept = 0

    def take(self) -> bool:
        if self.kept >= self.limit:
            return False
        self.kept += 1
        return True

    def give_back(self) -> None:
        self.kept -= 1


# Half the process's descriptors: the rest is for the connections of the moment, the API server's and files.
KEPT_CONNECTIONS = ConnectionBudget(resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 2)


class ProbeHttpError(Exception):
    """The server's answer was not HTTP (or the connection ended before one)."""


@dataclass(frozen=True)
class _Head:
    status: int
    body_length: int | None  # None: not framed by Content-Length (chunked, or until the connection closes)
    reusable: bool


def _parse_head(head: bytes) -> _Head:
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ProbeHttpError(f"not an HTTP status line: {lines[0][:80]!r}")
    length: int | None = None
    chunked = close = False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"content-length" and value.isdigit():
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = value != b"identity"
        elif name == b"connection":
            close = b"close" in value
    if chunked:
        length = None
    http11 = parts[0] == b"HTTP/1.1"
    return _Head(int(parts[1]), length, reusable=http11 and not close and length is not None)


class _Response(asyncio.Protocol):
    """Reads one answer at a time off a connection; `waiter` gets its status once it is framed."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[int] | None = None
        self.reusable = False
        self.closed = False
        self._buffer = bytearray()
        self._head: _Head | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def expect(self, waiter: "asyncio.Future[int]") -> None:
        self.waiter, self._head, self.reusable = waiter, None, False
        self._buffer.clear()

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            return  # nothing asked: a late body, or a server talking out of turn (the connection is not reused)
        self._buffer += data
        try:
            self._advance()
        except ProbeHttpError as error:
            self.waiter.set_exception(error)

    def _advance(self) -> None:
        assert self.waiter is not None
        if self._head is None:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_HEAD_BYTES:
                    raise ProbeHttpError(f"no end of the headers within {MAX_HEAD_BYTES} bytes")
                return
            self._head = _parse_head(bytes(self._buffer[:end]))
            del self._buffer[: end + 4]
        if self._head.body_length is None:
            self.waiter.set_result(self._head.status)  # unframed: judged now, the connection not reused
        elif len(self._buffer) >= self._head.body_length:
            self.reusable = self._head.reusable and len(self._buffer) == self._head.body_length
            self.waiter.set_result(self._head.status)

    def eof_received(self) -> bool:
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ProbeHttpError(f"connection closed before an answer ({exc or 'EOF'})"))


class HttpProbe:
    """GET requests of one probe (or hook) to one container; with `keep_alive`, on one reused connection."""

    def __init__(self, *, keep_alive: bool, budget: ConnectionBudget = KEPT_CONNECTIONS) -> None:
        self._keep_alive = keep_alive
        self._budget = budget
        self._connection: _Response | None = None
        self._endpoint: tuple[str, str, int] | None = None
        self._kept_in_budget = False  # the open connection counts in the budget

    async def get(self, scheme: str, host: str, port: int, path: str, headers: dict[str, str], limit_s: float) -> int:
        """The answer's status; raises TimeoutError, OSError or ProbeHttpError when there is none in time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        connection = self._kept(scheme, host, port)
        if connection is None:
            connection = await self._connect_by(deadline, scheme, host, port)
        assert connection.transport is not None
        fields = {"Host": f"{host}:{port}", "User-Agent": "kube-probe/1.35", "Accept": "*/*", **headers}
        if not self._keep_alive:
            fields["Connection"] = "close"
        request = f"GET {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items()) + "\r\n"
        waiter: asyncio.Future[int] = loop.create_future()
        connection.expect(waiter)
        connection.transport.write(request.encode("latin-1"))
        timer = _Deadline(deadline, functools.partial(_expire, waiter))
        try:
            status = await waiter
        except BaseException:
            self.close()
            raise
        finally:
            timer.cancel()
        if not (self._keep_alive and connection.reusable and self._keep()):
            self.close()
        return status

    def _keep(self) -> bool:
        """Whether the connection may stay open for the next probe (it then counts in the budget)."""
        if not self._kept_in_budget:
            self._kept_in_budget = self._budget.take()
        return self._kept_in_budget

    def _kept(self, scheme: str, host: str, port: int) -> _Response | None:
        """The connection kept from the last probe, if it is still open to the same endpoint."""
        if self._connection is not None and not self._connection.closed and self._endpoint == (scheme, host, port):
            return self._connection
        return None

    async def _connect_by(self, deadline: float, scheme: str, host: str, port: int) -> _Response:
        """A new connection, or TimeoutError once `deadline` (a `_Deadline`) is over. The attempt is a task of
        its own that the deadline cancels; a cancellation of the caller reaches it too. (Not wait_for: Python
        3.11's wait_for loses a cancellation that arrives as the attempt ends, and a probe loop cancelled at its
        container's exit then ran on forever, holding up that Pod's deletion.)"""
        attempt = asyncio.create_task(self._connect(scheme, host, port))
        timer = _Deadline(deadline, attempt.cancel)
        try:
            return await attempt
        except asyncio.CancelledError:
            if timer.expired and not _caller_cancelled():
                raise TimeoutError("no connection within the probe's timeout") from None
            raise
        finally:
            timer.cancel()
            attempt.cancel()

    async def _connect(self, scheme: str, host: str, port: int) -> _Response:
        endpoint = (scheme, host, port)
        self.close()
        context = None
        if scheme == "https":
            context = ssl.create_default_context()
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        _, connection = await asyncio.get_running_loop().create_connection(_Response, host, port, ssl=context)
        self._connection, self._endpoint = connection, endpoint
        return connection

    def close(self) -> None:
        if self._connection is not None and self._connection.transport is not None:
            self._connection.transport.close()
        self._connection = None
        if self._kept_in_budget:
            self._budget.give_back()
            self._kept_in_budget = False


def _caller_cancelled() -> bool:
    """Whether the running task itself is being cancelled (not only something it awaited)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class _Lateness:
    """How late one event loop has run, summed: a timer every TICK_S notes how long after its due time it ran.
    A busy loop runs each callback behind thousands of others, so every step of a probe (the connection made,
    the request sent, the answer read) waits about that long too."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.total = 0.0
        self._due = loop.time() + TICK_S
        loop.call_at(self._due, self._tick)  # the loop is not referred to from here: `_LATENESS` is weak

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        self.total += max(0.0, now - self._due)
        self._due = now + TICK_S
        loop.call_at(self._due, self._tick)


_LATENESS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Lateness]" = weakref.WeakKeyDictionary()


def _lateness(loop: asyncio.AbstractEventLoop) -> _Lateness:
    found = _LATENESS.get(loop)
    if found is None:
        found = _LATENESS[loop] = _Lateness(loop)
    return found


class _Deadline:
    """Calls `expire` at `deadline` (loop time), unless the loop ran late meanwhile: then what the server sent
    may sit in callbacks not yet run, so the deadline is put off by that lateness (`MAX_OWED_S` in all at
    most) and checked again."""

    def __init__(self, deadline: float, expire: Callable[[], object]) -> None:
        self._loop = asyncio.get_running_loop()
        self._lateness = _lateness(self._loop)
        self._due, self._expire, self._owed = deadline, expire, 0.0
        self._seen = self._lateness.total
        self.expired = False
        self._handle = self._loop.call_at(deadline, self._come_due)

    def _come_due(self) -> None:
        now = self._loop.time()
        late = (self._lateness.total - self._seen) + (now - self._due)
        self._seen = self._lateness.total
        if late > ON_TIME_S and self._owed + late <= MAX_OWED_S:
            self._owed += late
            self._due = now + late
            self._handle = self._loop.call_at(self._due, self._come_due)
            return
        self.expired = True
        self._expire()

    def cancel(self) -> None:
        self._handle.cancel()


def _expire(waiter: "asyncio.Future[int]") -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError("no answer within the probe's timeout"))
