"""The probes server (FMA's `probes` package): `GET /ready` for the kubelet's readinessProbe."""

from aiohttp import web

from .errors import spi_error
from .metrics import RequesterMetrics
from .middleware import count_and_contain, text
from .readiness import Readiness

READY_PATH = "/ready"
DEFAULT_PORT = 8080


def ready_response(ready: bool) -> web.Response:
    return text("OK") if ready else text("Service Unavailable", 503)


def build_probes_app(readiness: Readiness, metrics: RequesterMetrics) -> web.Application:
    async def ready(request: web.Request) -> web.Response:
        return ready_response(readiness.ready)

    app = web.Application(middlewares=[count_and_contain(metrics, "probes", spi_error)])
    app.router.add_get(READY_PATH, ready)
    return app
