"""What the requester's HTTP servers do around every handler: count it, answer errors in JSON, never crash."""

import logging
from collections.abc import Callable

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from .metrics import RequesterMetrics

log = logging.getLogger(__name__)

# (status, message, headers) -> the server's error answer (the SPI's `SpiError`, the proxy's OpenAI error).
ErrorResponse = Callable[[int, str, dict[str, str]], web.Response]
_KEPT_HEADERS = frozenset({"allow", "retry-after", "www-authenticate"})


def text(body: str, status: int = 200) -> web.Response:
    """FMA's requester answers in plain text lines."""
    return web.Response(text=body if body.endswith("\n") else body + "\n", status=status)


def matched_route(request: web.Request) -> str:
    """The route's path pattern; `unmatched` for 404/405."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


def _message(request: web.Request, err: web.HTTPException) -> str:
    """aiohttp's own refusals (no route, wrong method, body too large), said in words."""
    if err.status == 404:
        return f"no route {request.method} {request.path}"
    if err.status == 405:
        return f"{request.method} is not allowed on {request.path} (allowed: {err.headers.get('Allow', 'none')})"
    return err.text or err.reason


def count_and_contain(
    metrics: RequesterMetrics, server: str, error: ErrorResponse, route_of: Callable[[web.Request], str] = matched_route
) -> Middleware:
    """Counts each request by route (`route_of`) and code; errors become `error` answers, a bug a 500."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        route = route_of(request)
        try:
            response = await handler(request)
        except web.HTTPException as err:
            if err.status < 400:
                metrics.http_requests.labels(server, route, request.method, str(err.status)).inc()
                raise
            headers = {k: v for k, v in err.headers.items() if k.lower() in _KEPT_HEADERS}
            response = error(err.status, _message(request, err), headers)
        except Exception as err:
            log.exception("%s %s failed", request.method, request.path)
            response = error(500, f"internal error: {err!r}", {})
        metrics.http_requests.labels(server, route, request.method, str(response.status)).inc()
        return response

    return middleware
