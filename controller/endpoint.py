"""The controllers' own HTTP endpoint: Prometheus metrics and a liveness check, served beside the event loop.

The endpoint runs in its own threads, not on the controller's event loop. A controller whose loop is
saturated (thousands of objects arriving at once on a busy machine) is still making progress, and a restart
would only lose its caches and start the work over; on the loop, its `/healthz` answered seconds late there,
and the kubelet restarted it. So `/healthz` answers from a thread and says what a restart would fix: that
the loop has not run at all for `STALL_S` (a blocking call, a deadlock). `/metrics` answers from a thread
too, so that a scrape sees an overloaded controller rather than a timeout.
"""

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from api.tasks import Background

STALL_S = 60.0  # the event loop not running for this long fails /healthz
BEAT_S = 1.0  # how often the loop notes that it ran

StartResponse = Callable[..., Any]


class LoopBeat:
    """When the event loop last ran: written by a task on the loop, read by the endpoint's threads."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    async def run(self) -> None:
        while True:
            self.last = time.monotonic()
            await asyncio.sleep(BEAT_S)

    def stalled_for(self) -> float:
        return time.monotonic() - self.last


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes and scrapes come every few seconds; a log line each would bury the controller's own."""


def endpoint(registry: CollectorRegistry, beat: LoopBeat) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    """The WSGI application: `/metrics`, `/healthz`, and 404 for anything else."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return metrics(environ, start_response)  # type: ignore[no-any-return]
        if path == "/healthz":
            stalled = beat.stalled_for()
            if stalled < STALL_S:
                start_response("200 OK", [("Content-Type", "text/plain")])
                return [b"ok"]
            start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
            return [f"the event loop has not run for {stalled:.0f} s".encode()]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found"]

    return app


@contextlib.asynccontextmanager
async def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> AsyncIterator[None]:
    """Serve `/metrics` and `/healthz` on host:port while the body runs."""
    beat = LoopBeat()
    server = make_server(host, port, endpoint(registry, beat), _ThreadingServer, _QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics-endpoint", daemon=True).start()
    beating = Background()
    beating.start(beat.run(), name="loop-beat")
    try:
        yield
    finally:
        await beating.stop()
        await asyncio.to_thread(server.shutdown)
        server.server_close()
