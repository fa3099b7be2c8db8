"""The SPI server (FMA's `coordination` package): what the dual-pods controller calls on the requester.

A thin layer over the GPU source, the readiness bit, the log relay and the proxy's target, plus
`/metrics` and the SPI's OpenAPI document. The routes that change the requester (become-ready and
-unready, set-log, the proxy's target) need the controller's bearer token (E15, `spi_auth`); those
that only read stay open, as in FMA: they change nothing and tell no more than the Pod's own
annotations and the API server do. Successes answer in FMA's plain text; errors are JSON `SpiError`s.
"""

import asyncio
import json
import logging
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from api import requester as contract
from api import version
from api.keys import DEFAULT_ADMIN_PORT
from api.openapi import TEXT, Content, Operation, Reply, documented, operation_of, serve_openapi
from api.requester import SpiError, SpiErrorReason
from api.validation import validation_message

from . import proxy_openapi
from .backend_limits import BackendLimits
from .errors import spi_error
from .gpus import GpuSource
from .log_relay import LogRelay, StartPositionError
from .metrics import RequesterMetrics
from .middleware import count_and_contain, text
from .proxy_target import ProxyTarget, TargetError, parse_target
from .readiness import Readiness
from .spi_auth import OpenSpi, SpiAuth

log = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
DEFAULT_PORT = DEFAULT_ADMIN_PORT
NO_GPUS = "no GPUs found"
VERSION = version.release()

GPUS = web.AppKey("gpus", GpuSource)
READINESS = web.AppKey("readiness", Readiness)
LOG_RELAY = web.AppKey("log_relay", LogRelay)
METRICS = web.AppKey("metrics", RequesterMetrics)
PROXY_TARGET = web.AppKey("proxy_target", ProxyTarget)
BACKEND_LIMITS = web.AppKey("backend_limits", BackendLimits)
AUTH = web.AppKey("auth", SpiAuth)
PROXY_DOCUMENT = web.AppKey("proxy_document", dict)

ERROR = Content(SpiError)
OK = Reply("done", TEXT)
REFUSED = {
    401: Reply("no bearer token, one the API server does not accept for this requester, or one this requester "
               "could not check (reason `CannotVerify`)", ERROR, {"WWW-Authenticate": "Bearer"}),
    403: Reply("the token's ServiceAccount is not a controller this requester trusts", ERROR),
}  # fmt: skip


def _json(value: object) -> web.Response:
    return web.Response(text=json.dumps(value) + "\n", content_type="application/json")


@documented(Operation("The GPU UUIDs of this requester's container", {
    200: Reply("the UUIDs, found once at start", Content(list[str])),
    500: Reply("no GPUs were found (reason `NoGPUs`)", ERROR),
}))  # fmt: skip
async def accelerators(request: web.Request) -> web.Response:
    uuids = request.app[GPUS].uuids
    return _json(list(uuids)) if uuids else spi_error(500, NO_GPUS, reason=SpiErrorReason.NO_GPUS)


@documented(Operation("MiB of memory in use on each of the GPUs", {
    200: Reply("UUID -> MiB in use", Content(dict[str, int])),
    500: Reply("no GPUs (`NoGPUs`), or some could not be read (`GPUQueryFailed`, one line per GPU)", ERROR),
}))  # fmt: skip
async def memory_usage(request: web.Request) -> web.Response:
    gpus = request.app[GPUS]
    if not gpus.uuids:
        return spi_error(500, NO_GPUS, reason=SpiErrorReason.NO_GPUS)
    usage = await asyncio.to_thread(gpus.memory_usage)
    if usage.errors:
        return spi_error(500, "\n".join(usage.errors), reason=SpiErrorReason.GPU_QUERY_FAILED)
    return _json(usage.mib)


@documented(Operation("Mark the requester ready: /ready answers 200 and the proxy forwards", {200: OK, **REFUSED},
                      bearer=True))  # fmt: skip
async def become_ready(request: web.Request) -> web.Response:
    request.app[READINESS].set(True)
    return text("OK")


@documented(Operation("Mark the requester unready: /ready answers 503 and the proxy holds new requests",
                      {200: OK, **REFUSED}, bearer=True))  # fmt: skip
async def become_unready(request: web.Request) -> web.Response:
    request.app[READINESS].set(False)
    return text("OK")


@documented(Operation(
    "Relay a chunk of a log to the requester's stdout",
    {
        200: Reply("accepted; says how many bytes were new", TEXT),
        400: Reply("startPos missing, not an integer, negative or beyond the bytes accepted so far", ERROR),
        413: Reply(f"a body over {contract.MAX_LOG_CHUNK_BYTES} bytes", ERROR),
        500: Reply("stdout cannot be written (`LogWriteFailed`)", ERROR),
        **REFUSED,
    },
    description="The body holds the log's bytes from offset startPos; only bytes beyond those already accepted "
    "are written, so a resent or overlapping chunk never duplicates output.",
    query=contract.SetLogQuery,
    body=Content(media_type="text/plain", max_bytes=contract.MAX_LOG_CHUNK_BYTES),
    body_required=False,
    bearer=True,
))  # fmt: skip
async def set_log(request: web.Request) -> web.Response:
    raw = request.query.get("startPos")
    if not raw:
        return spi_error(400, "Missing startPos parameter", reason=SpiErrorReason.INVALID_PARAMETER)
    try:
        query = contract.SetLogQuery.model_validate({"startPos": raw})
    except ValidationError as err:
        return spi_error(400, validation_message(err), reason=SpiErrorReason.INVALID_PARAMETER)
    chunk = await request.read()
    try:
        return text(await request.app[LOG_RELAY].add(query.start_pos, chunk))
    except StartPositionError as err:
        return spi_error(400, str(err), reason=SpiErrorReason.INVALID_PARAMETER)
    except OSError as err:
        return spi_error(500, f"Failed to write log chunk: {err}", reason=SpiErrorReason.LOG_WRITE_FAILED)


@documented(Operation(
    "Point the request proxy at the bound model server",
    {
        200: Reply("`configured proxy to: ADDRESS:PORT` (also for a repeat of the same target)", TEXT),
        400: Reply("the body is not a valid target; the message names the value", ERROR),
        **REFUSED,
    },
    description="The latest call wins: the proxy follows the controller's binding.",
    body=Content(contract.ProxyConfig),
    bearer=True,
))  # fmt: skip
async def put_proxy_config(request: web.Request) -> web.Response:
    try:
        target = parse_target(await request.read())
    except TargetError as err:
        return spi_error(400, f"invalid proxy config: {err}")
    if request.app[PROXY_TARGET].set(target):
        log.info("proxy configured", extra={"target": target.model_dump(exclude_none=True)})
    return text(f"configured proxy to: {target.host_port}")


@documented(Operation("The proxy's target and what it knows of the server's limits", {
    200: Reply("the target as put, plus `limits`", Content(contract.ProxyConfigState)),
    404: Reply("no target yet", ERROR),
}))  # fmt: skip
async def get_proxy_config(request: web.Request) -> web.Response:
    target = request.app[PROXY_TARGET].target
    if target is None:
        return spi_error(404, "proxy not configured")
    limits = request.app[BACKEND_LIMITS]
    current = limits.current()
    known = contract.ProxyLimits(
        max_model_len=current.max_model_len, kv_cache_tokens=current.kv_cache_tokens, max_num_seqs=limits.max_num_seqs()
    )
    state = contract.ProxyConfigState(**target.model_dump(), limits=known)
    return _json(state.model_dump(mode="json", exclude={"limits"}, exclude_none=True) | {"limits": known.model_dump()})


@documented(Operation("Prometheus metrics of the requester", {200: Reply("Prometheus text", TEXT)}))
async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


@documented(Operation("The request proxy's OpenAPI document (the proxy port forwards /openapi.json to the server)",
                      {200: Reply("OpenAPI 3.1", Content(dict[str, Any]))}))  # fmt: skip
async def proxy_openapi_json(request: web.Request) -> web.Response:
    return web.json_response(request.app[PROXY_DOCUMENT])


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Routes documented as needing a bearer token get one checked before anything else happens."""
    operation = operation_of(request.match_info.route.handler)
    if operation is not None and operation.bearer:
        refusal = await request.app[AUTH].check(request)
        if refusal is not None:
            return spi_error(refusal.status, refusal.detail, refusal.headers, refusal.reason)
    return await handler(request)


def build_spi_app(
    gpus: GpuSource,
    readiness: Readiness,
    log_relay: LogRelay,
    requester_metrics: RequesterMetrics,
    proxy_target: ProxyTarget,
    backend_limits: BackendLimits,
    auth: SpiAuth,
) -> web.Application:
    app = web.Application(
        middlewares=[count_and_contain(requester_metrics, "spi", spi_error), authenticate],
        client_max_size=contract.MAX_LOG_CHUNK_BYTES,
    )
    app[GPUS], app[READINESS], app[LOG_RELAY], app[METRICS] = gpus, readiness, log_relay, requester_metrics
    app[PROXY_TARGET], app[BACKEND_LIMITS], app[AUTH] = proxy_target, backend_limits, auth
    app.router.add_get(contract.ACCELERATORS_PATH, accelerators)
    app.router.add_get(contract.MEMORY_USAGE_PATH, memory_usage)
    app.router.add_post(contract.BECOME_READY_PATH, become_ready)
    app.router.add_post(contract.BECOME_UNREADY_PATH, become_unready)
    app.router.add_post(contract.SET_LOG_PATH, set_log)
    app.router.add_put(contract.PROXY_CONFIG_PATH, put_proxy_config)
    app.router.add_get(contract.PROXY_CONFIG_PATH, get_proxy_config)
    app.router.add_get(METRICS_PATH, metrics)
    app[PROXY_DOCUMENT] = proxy_openapi.document()
    app.router.add_get(contract.PROXY_OPENAPI_PATH, proxy_openapi_json)
    bearer = None if isinstance(auth, OpenSpi) else (
        "a ServiceAccount token of the dual-pods controller for this requester's audience "
        "`dualpods-requester:<namespace>:<pod>`, checked with a TokenReview"
    )  # fmt: skip
    serve_openapi(app, "dualpods requester SPI", VERSION, description=__doc__ or "", bearer_description=bearer)
    return app
