"""What the requester's HTTP servers do around every handler: count it, and never crash."""

import logging
from collections.abc import Callable

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from .metrics import RequesterMetrics

log = logging.getLogger(__name__)


def text(body: str, status: int = 200) -> web.Response:
    """FMA's requester answers in plain text lines."""
    return web.Response(text=body if body.endswith("\n") else body + "\n", status=status)


def matched_route(request: web.Request) -> str:
    """The route's path pattern; `unmatched` for 404/405."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


def count_and_contain(
    metrics: RequesterMetrics, server: str, route_of: Callable[[web.Request], str] = matched_route
) -> Middleware:
    """Counts each request by route (`route_of`) and code; a bug becomes a 500, not a crash."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        route = route_of(request)
        try:
            response = await handler(request)
        except web.HTTPException as err:
            metrics.http_requests.labels(server, route, request.method, str(err.status)).inc()
            raise
        except Exception as err:
            log.exception("%s %s failed", request.method, request.path)
            response = text(f"internal error: {err!r}", 500)
        metrics.http_requests.labels(server, route, request.method, str(response.status)).inc()
        return response

    return middleware
