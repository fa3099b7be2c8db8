"""The request-guarding proxy (E7): the requester Pod's stable address for its bound model server's OpenAI API.

FMA 0.7 plans a TCP proxy in the requester; this one speaks HTTP, so that it can
- hold requests while the requester is not ready (not bound yet, or its instance still waking) and
  forward them once it is, or answer 503 with `Retry-After` after `hold_timeout` seconds;
- refuse a completion that can never fit with a 400 saying why (`guard`);
- shed load with 429 and `Retry-After` when the server's queue is too deep (`overload`);
and otherwise passes requests and answers through unchanged, streaming both ways without buffering.
Monitoring paths are forwarded at once, never held or limited; `/ready` is the requester's readiness.
"""

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from api.openai_errors import ApiError
from api.tasks import Background

from . import guard
from .backend_limits import BackendLimits
from .metrics import RequesterMetrics
from .middleware import count_and_contain
from .overload import Overload
from .probes import READY_PATH, ready_response
from .prompt_tokens import PromptCounter
from .proxy_target import ProxyTarget
from .readiness import Readiness
from .upstream import Upstream

log = logging.getLogger(__name__)

DEFAULT_PORT = 8082  # FMA's --proxy-port
MONITORING_PATHS = frozenset({"/health", "/healthz", "/ping", "/metrics", "/version"})
GUARDED_PATHS = {"/v1/completions": False, "/v1/chat/completions": True}  # path -> is chat
# KAITO's rate-limited paths, with vLLM's /v1 and /v2 spellings of them.
INFERENCE_PATHS = frozenset(
    {*GUARDED_PATHS, "/v1/embeddings", "/v1/responses", "/tokenize", "/pooling", "/classify"}
    | {"/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank"}
)
ROUTE_LABELS = MONITORING_PATHS | INFERENCE_PATHS | {READY_PATH, "/v1/models"}
# Per-connection headers (RFC 9110 §7.6.1), and Expect, which the proxy's own server answers.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te", "trailer"}
    | {"transfer-encoding", "upgrade", "expect"}
)
UNAVAILABLE_RETRY_AFTER_S = 5
OVERLOADED_RETRY_AFTER_S = 1
MAX_GUARDED_BODY_BYTES = 64 * 1024 * 1024  # a guarded body is read whole; chat bodies may carry images


def route_label(request: web.Request) -> str:
    """The metric's route: a known path as it is, anything else `other` (paths are the client's to choose)."""
    return request.path if request.path in ROUTE_LABELS else "other"


def _unavailable(message: str) -> web.Response:
    return ApiError(
        503,
        message,
        err_type="server_error",
        code="model_server_unavailable",
        headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER_S)},
    ).response()


def _error(status: int, message: str, headers: dict[str, str]) -> web.Response:
    """The proxy's own refusals in OpenAI's shape, like the model server's (a body too large to judge, ...)."""
    return ApiError(status, message, headers=headers).response()


def _without_hop_by_hop(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    return CIMultiDict((name, value) for name, value in headers.items() if name.lower() not in HOP_BY_HOP)


class Proxy:
    def __init__(
        self,
        target: ProxyTarget,
        upstream: Upstream,
        limits: BackendLimits,
        readiness: Readiness,
        metrics: RequesterMetrics,
        hold_timeout: float,
        background: Background,
    ) -> None:
        self._target = target
        self._upstream = upstream
        self._limits = limits
        self._readiness = readiness
        self._metrics = metrics
        self._hold_timeout = hold_timeout
        self._counter = PromptCounter(upstream)
        self._overload = Overload(upstream, limits, background)
        metrics.in_flight.set_function(lambda: self._overload.in_flight)

    def _forwarding(self) -> bool:
        return self._readiness.ready and self._target.target is not None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path == READY_PATH:
            return ready_response(self._forwarding())
        if path in MONITORING_PATHS:
            if self._target.target is None:
                return _unavailable("no model server is bound to this requester yet.")
            return await self._forward(request, None, time.monotonic())
        if not self._forwarding() and not await self._hold():
            if self._target.target is None:
                return _unavailable(f"no model server was bound to this requester within {self._hold_timeout:g} s.")
            return _unavailable(f"the model server did not become ready within {self._hold_timeout:g} s.")
        arrived = time.monotonic()
        body = None
        chat = GUARDED_PATHS.get(path)
        if chat is not None and request.method == "POST":
            body = await request.read()
            rejection = await guard.judge(body, chat, await self._limits.limits(), self._counter)
            if rejection is not None:
                self._metrics.guard_rejections.labels(rejection.reason).inc()
                log.info("refused a request that cannot fit", extra={"path": path, "why": rejection.message})
                return ApiError(
                    400, rejection.message, rejection.param, err_type="invalid_request_error", code=rejection.code
                ).response()
        if path not in INFERENCE_PATHS:
            return await self._forward(request, body, arrived)
        shed = self._overload.admit()
        if shed is not None:
            self._metrics.overload_rejections.inc()
            return ApiError(
                429,
                shed.message,
                err_type="rate_limit_error",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(OVERLOADED_RETRY_AFTER_S)},
            ).response()
        try:
            return await self._forward(request, body, arrived)
        finally:
            self._overload.release()

    async def _hold(self) -> bool:
        """Wait, up to the hold timeout, until bound and ready; False when that did not happen."""
        started = time.monotonic()
        self._metrics.holding.inc()
        try:
            async with asyncio.timeout(self._hold_timeout):
                while not self._forwarding():
                    await self._target.wait()
                    await self._readiness.wait()
            outcome = "forwarded"
        except TimeoutError:
            outcome = "timed_out"
        finally:
            self._metrics.holding.dec()
        self._metrics.held.labels(outcome).inc()
        self._metrics.hold_seconds.observe(time.monotonic() - started)
        return outcome == "forwarded"

    async def _forward(self, request: web.Request, body: bytes | None, arrived: float) -> web.StreamResponse:
        """Send the request upstream and relay the answer as it arrives. `body`: already read, else streamed."""
        data = body if body is not None else (request.content if request.body_exists else None)
        sent = time.monotonic()
        try:
            upstream = await self._upstream.session.request(
                request.method,
                self._upstream.url(request.path_qs),
                headers=_request_headers(request),
                data=data,
                allow_redirects=False,
            )
        except (aiohttp.ClientError, OSError) as err:
            unreachable = isinstance(err, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError)
            self._metrics.upstream_errors.labels("connect" if unreachable else "broken").inc()
            what = "cannot be reached" if unreachable else "closed the connection before answering"
            log.warning("model server failed", extra={"upstream": self._upstream.host_port, "error": repr(err)})
            message = f"the model server at {self._upstream.host_port} {what}: {err}."
            return ApiError(502, message, err_type="server_error", code="bad_gateway").response()
        complete = False
        try:
            answered = time.monotonic()
            response = web.StreamResponse(
                status=upstream.status, reason=upstream.reason, headers=_without_hop_by_hop(upstream.headers)
            )
            await response.prepare(request)
            self._metrics.added_latency.observe((sent - arrived) + (time.monotonic() - answered))
            complete = await self._relay(request, upstream, response)
            return response
        finally:
            if complete:
                upstream.release()
            else:
                upstream.close()  # stops the server's work for a client that went away

    async def _relay(
        self, request: web.Request, upstream: aiohttp.ClientResponse, response: web.StreamResponse
    ) -> bool:
        """Copy the answer's body chunk by chunk as it arrives; False when either side broke off."""
        chunks = upstream.content.iter_any()
        while True:
            try:
                chunk = await anext(chunks)
            except StopAsyncIteration:
                break
            except aiohttp.ClientError as err:
                self._metrics.upstream_errors.labels("broken").inc()
                log.warning("model server broke off an answer", extra={"path": request.path, "error": repr(err)})
                if request.transport is not None:
                    request.transport.close()  # the client must see a cut answer, not a complete one
                return False
            try:
                await response.write(chunk)
            except ConnectionResetError:
                return False  # the client went away
        await response.write_eof()
        return True


def _request_headers(request: web.Request) -> CIMultiDict[str]:
    headers = _without_hop_by_hop(request.headers)
    headers.popall("Host", None)  # the client library sets the upstream's
    return headers


async def _prefetch_limits(target: ProxyTarget, readiness: Readiness, limits: BackendLimits) -> None:
    """Learn the server's limits as soon as it is bound and ready, rather than on the first request."""
    await target.wait()
    await readiness.wait()
    limits.prefetch()


def build_proxy_app(
    target: ProxyTarget,
    upstream: Upstream,
    limits: BackendLimits,
    readiness: Readiness,
    metrics: RequesterMetrics,
    hold_timeout: float,
    background: Background,
) -> web.Application:
    """The proxy; `background` runs its own calls to the model server (its limits, its queue samples), which end
    with it, before the client they use closes."""
    proxy = Proxy(target, upstream, limits, readiness, metrics, hold_timeout, background)

    async def lifetime(app: web.Application) -> AsyncIterator[None]:
        background.start(_prefetch_limits(target, readiness, limits), name="prefetch the limits")
        yield
        await background.stop()
        await upstream.close()

    app = web.Application(
        middlewares=[count_and_contain(metrics, "proxy", _error, route_label)], client_max_size=MAX_GUARDED_BODY_BYTES
    )
    app.cleanup_ctx.append(lifetime)
    app.router.add_route("*", "/{path:.*}", proxy.handle)
    return app
