"""The probes server (FMA's `probes` package): `GET /ready` for the kubelet's readinessProbe.

An unready answer is held for up to UNREADY_HOLD_S, and a become-ready meanwhile answers 200 at once. A
kubelet probes once a period (1 s at the least), so with a 1 s period the Pod turns Ready within a few
milliseconds of the controller's become-ready half of the time, and within half a second otherwise,
rather than up to a whole period later: the last part of a hot swap's latency.
"""

import asyncio
import contextlib

from aiohttp import web

from .errors import spi_error
from .metrics import RequesterMetrics
from .middleware import count_and_contain, text
from .readiness import Readiness

READY_PATH = "/ready"
DEFAULT_PORT = 8080
UNREADY_HOLD_S = 0.5  # well within a probe's shortest timeout (1 s), network and a busy node included


def ready_response(ready: bool) -> web.Response:
    return text("OK") if ready else text("Service Unavailable", 503)


def build_probes_app(readiness: Readiness, metrics: RequesterMetrics) -> web.Application:
    async def ready(request: web.Request) -> web.Response:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(UNREADY_HOLD_S):
                await readiness.wait()
        return ready_response(readiness.ready)

    app = web.Application(middlewares=[count_and_contain(metrics, "probes", spi_error)])
    app.router.add_get(READY_PATH, ready)
    return app
