"""The loopback kubelet's probe GET (`e2e/kubelet/http_probe.py`) against real HTTP servers on loopback:
how it judges answers, reuses and drops connections, and honours its deadline."""

import asyncio
import datetime
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from e2e.kubelet import probes
from e2e.kubelet.http_probe import ConnectionBudget, HttpProbe, ProbeHttpError
from e2e.kubelet.status import now

HOST = "127.0.0.1"


class Server:
    """An aiohttp server whose /ready answers `status` after `delay` seconds; `clients` holds the address
    (host, port) of every connection a request came on."""

    def __init__(self) -> None:
        self.status = 200
        self.delay = 0.0
        self.clients: set[tuple[str, int]] = set()
        self.port = 0
        self.runner: web.AppRunner | None = None

    async def start(self) -> None:
        async def ready(request: web.Request) -> web.Response:
            self._seen(request)
            await asyncio.sleep(self.delay)
            return web.Response(status=self.status, text="ok")

        async def chunked(request: web.Request) -> web.StreamResponse:
            self._seen(request)
            response = web.StreamResponse()
            response.enable_chunked_encoding()
            await response.prepare(request)
            await response.write(b"streamed")
            await response.write_eof()
            return response

        app = web.Application()
        app.router.add_get("/ready", ready)
        app.router.add_get("/chunked", chunked)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, HOST, self.port).start()
        self.port = self.runner.addresses[0][1]

    def _seen(self, request: web.Request) -> None:
        assert request.transport is not None
        self.clients.add(request.transport.get_extra_info("peername"))

    @property
    def connections(self) -> int:
        return len(self.clients)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    found = Server()
    await found.start()
    yield found
    await found.stop()


@pytest.fixture
def kept() -> Iterator[HttpProbe]:
    """A probe that keeps its connection (a simulated container's), closed afterwards."""
    http = HttpProbe(keep_alive=True)
    yield http
    http.close()


async def _no_exec(argv: list[str], limit: float) -> tuple[int, str]:
    return 126, ""


async def test_a_kept_connection_is_reused_and_answers_are_judged(server: Server, kept: HttpProbe) -> None:
    assert await kept.get("http", HOST, server.port, "/ready", {}, 1.0) == 200
    server.status = 503
    assert await kept.get("http", HOST, server.port, "/ready", {}, 1.0) == 503
    server.status = 302
    assert await kept.get("http", HOST, server.port, "/ready", {}, 1.0) == 302
    assert server.connections == 1


async def test_without_keep_alive_each_probe_opens_a_connection(server: Server) -> None:
    http = HttpProbe(keep_alive=False)
    for _ in range(3):
        assert await http.get("http", HOST, server.port, "/ready", {}, 1.0) == 200
    assert server.connections == 3


async def test_probes_beyond_the_budget_open_a_connection_each_until_a_kept_one_closes(server: Server) -> None:
    budget = ConnectionBudget(2)
    probes = [HttpProbe(keep_alive=True, budget=budget) for _ in range(3)]
    for _ in range(3):
        for http in probes:
            assert await http.get("http", HOST, server.port, "/ready", {}, 1.0) == 200
    assert budget.kept == 2
    assert server.connections == 2 + 3, "two kept connections, and one for each probe of the third"
    probes[0].close()  # its container exited: its place in the budget goes to the next probe that keeps one
    assert budget.kept == 1
    for _ in range(2):
        assert await probes[2].get("http", HOST, server.port, "/ready", {}, 1.0) == 200
    assert budget.kept == 2
    assert server.connections == 5 + 1, "the third probe kept its next connection"
    for http in probes:
        http.close()
    assert budget.kept == 0


async def test_an_unframed_answer_is_judged_and_its_connection_dropped(server: Server, kept: HttpProbe) -> None:
    assert await kept.get("http", HOST, server.port, "/chunked", {}, 1.0) == 200
    assert await kept.get("http", HOST, server.port, "/chunked", {}, 1.0) == 200
    assert server.connections == 2


async def test_a_server_that_closed_the_kept_connection_gets_a_new_one(server: Server, kept: HttpProbe) -> None:
    assert await kept.get("http", HOST, server.port, "/ready", {}, 1.0) == 200
    await server.stop()  # closes every connection
    await server.start()
    await asyncio.sleep(0.05)
    assert await kept.get("http", HOST, server.port, "/ready", {}, 1.0) == 200


@pytest.mark.looptime  # the server's delay and the probe's timeout are the loop's seconds, however busy the machine
async def test_a_late_answer_fails_and_a_gone_server_fails(server: Server, kept: HttpProbe) -> None:
    http = kept
    server.delay = 1.0
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        await http.get("http", HOST, server.port, "/ready", {}, 0.3)
    assert loop.time() - started == pytest.approx(0.3, abs=0.01)  # at its timeout, not at the answer
    port = server.port
    await server.stop()
    with pytest.raises(ConnectionRefusedError):
        await http.get("http", HOST, port, "/ready", {}, 0.5)


@pytest.fixture
def raw_server() -> Iterator[tuple[int, threading.Event]]:
    """A server in a thread of its own: answers each request 0.2 s after it arrives, the event set as it answers
    (before it sends: a client that has the answer may otherwise run before this thread gets to set it)."""
    listener = socket.create_server((HOST, 0))
    answered = threading.Event()

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(4096)
            time.sleep(0.2)
            answered.set()
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            connection.recv(4096)  # until the client closes

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1], answered
    listener.close()
    thread.join(timeout=5)


async def test_an_answer_waiting_at_the_deadline_counts(
    raw_server: tuple[int, threading.Event], kept: HttpProbe
) -> None:
    """The prober is late (its loop blocked past the deadline) but the server answered in time (aiohttp's
    client failed this probe)."""
    port, answered = raw_server
    loop = asyncio.get_running_loop()
    # Block the event loop from just after the request is sent until well past the 0.5 s deadline.
    loop.call_later(0.05, time.sleep, 1.0)
    assert await kept.get("http", HOST, port, "/ready", {}, 0.5) == 200
    assert answered.is_set()


async def test_garbage_is_not_an_answer() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(4096)
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await writer.drain()
        writer.close()

    listener = await asyncio.start_server(garbage, HOST, 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        with pytest.raises(ProbeHttpError):
            await HttpProbe(keep_alive=False).get("http", HOST, port, "/", {}, 1.0)
    finally:
        listener.close()
        await listener.wait_closed()


async def test_a_probe_reports_the_status_that_failed_it(server: Server, kept: HttpProbe) -> None:
    server.status = 500
    probe = client.V1Probe(http_get=client.V1HTTPGetAction(path="/ready", port=server.port), timeout_seconds=1)
    target = probes.ProbeTarget(HOST, {}, _no_exec, keep_alive=True)
    assert await probes.check(probe, target, kept) == (False, "HTTP probe failed with statuscode: 500")
    server.status = 200
    assert (await probes.check(probe, target, kept))[0]


async def test_a_due_probe_runs_at_once_and_the_period_keeps_its_phase(server: Server) -> None:
    """A sync's trigger (a Pod's annotations changed) probes now, not a period later; the ticks that follow
    stay where they were, as the kubelet's ticker does."""
    server.status = 503
    get = client.V1HTTPGetAction(path="/ready", port=server.port)
    # A period of 4 s, triggered half-way: probed at once means at 2 s, not at the 4 s tick; the phase kept means the
    # next tick at 4 s, not 6 s (a period after the trigger). Each bound lies 1.9 s from what it must tell apart,
    # against a few milliseconds of timer lateness on a quiet machine (a loaded one has taken tenths of a second).
    probe = client.V1Probe(http_get=get, period_seconds=4, failure_threshold=1, timeout_seconds=1)
    due = asyncio.Event()
    outcomes = probes.results(probe, probes.ProbeTarget(HOST, {}, _no_exec), now(), due)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert (await anext(outcomes))[0] is False
    server.status = 200
    await asyncio.sleep(2.0)
    due.set()
    assert await anext(outcomes) == (True, "")
    assert loop.time() - started < 3.9, "the trigger probed at once"
    server.status = 503
    assert (await anext(outcomes))[0] is False
    assert 3.9 < loop.time() - started < 5.9, "the next tick, a period after the first attempt"
    await outcomes.aclose()


async def test_the_initial_delay_counts_from_the_container_start(server: Server) -> None:
    """A readiness probe that begins when a startup probe succeeds has already waited its initialDelaySeconds
    (the kubelet's prober compares them with the container's StartedAt): counted again, a launcher turned Ready
    seconds late after each restart."""
    get = client.V1HTTPGetAction(path="/ready", port=server.port)
    probe = client.V1Probe(http_get=get, initial_delay_seconds=2, period_seconds=5, timeout_seconds=1)
    target = probes.ProbeTarget(HOST, {}, _no_exec)
    for age in (3.0, 1.0):  # the container started this long before the probe's worker
        started = now() - datetime.timedelta(seconds=age)
        outcomes = probes.results(probe, target, started)
        assert await anext(outcomes) == (True, "")
        first_attempt = (now() - started).total_seconds()
        # Not before the delay; right away once it is over (1 s of slack for a busy machine, less than the
        # 2 s the delay would add if counted from the worker's start).
        assert 1.99 <= first_attempt < max(age, 2.0) + 1.0, (age, first_attempt)
        await outcomes.aclose()


async def test_a_cancellation_as_the_connection_attempt_fails_is_not_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe loop is cancelled when its container exits; lost (Python 3.11's wait_for), it ran on forever
    and held up the Pod's deletion."""
    loop = asyncio.get_running_loop()
    attempt: asyncio.Future[None] = loop.create_future()

    async def connect(scheme: str, host: str, port: int) -> None:
        await attempt

    http = HttpProbe(keep_alive=True)
    monkeypatch.setattr(http, "_connect", connect)
    task = asyncio.create_task(http.get("http", HOST, 1, "/ready", {}, 5.0))
    await asyncio.sleep(0)
    attempt.set_exception(ConnectionRefusedError())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_connection_made_while_the_prober_was_late_counts(raw_server: tuple[int, threading.Event]) -> None:
    """One process probes for hundreds of Nodes: its loop, not the server, was late (at 5,000 launchers the
    kernel had made the connections on time, and liveness probes failed on the deadline's timer alone)."""
    port, answered = raw_server
    http = HttpProbe(keep_alive=False)
    probe = asyncio.create_task(http.get("http", HOST, port, "/ready", {}, 0.5))
    await asyncio.sleep(0)  # the probe has started its connection attempt
    asyncio.get_running_loop().call_soon(time.sleep, 1.0)  # then the prober's loop is busy past the deadline
    assert await probe == 200
    assert answered.is_set()


async def test_a_server_that_never_answers_fails_though_the_prober_was_late() -> None:
    """The prober's lateness is made up for, not more: a hung server (its connection made by the kernel, no
    answer) still fails the probe, a little after its timeout."""
    listener = socket.create_server((HOST, 0))  # never accepts, never answers
    try:
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, time.sleep, 0.6)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await HttpProbe(keep_alive=False).get("http", HOST, listener.getsockname()[1], "/", {}, 0.5)
        assert time.monotonic() - started < 2.5
    finally:
        listener.close()
