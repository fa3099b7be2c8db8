"""The launcher's HTTP API (aiohttp): FMA's `/v2/vllm/instances` routes plus sleep/wake (E1).

A thin layer: each handler parses its input (as FMA's FastAPI does, `request_parsing`), calls the
instance manager, and serializes the result in the launcher's `Dialect` (dualpods' API, or FMA's alone);
errors become `{"detail": ..., "reason": ...}` bodies with the status and reason their exception names.
Every handler carries its `Operation`, from which `/openapi.json` and `/docs` are built. A watch stream
that has nothing to send sends an empty line every WATCH_HEARTBEAT_S, so both ends can tell a quiet
stream from a dead connection.
"""

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.launcher import (
    API_TITLE,
    API_VERSION,
    INSTANCES_PATH,
    WATCH_HEARTBEAT_S,
    AllInstancesState,
    DeleteAllResult,
    ErrorBody,
    ErrorReason,
    EventType,
    Health,
    Index,
    InstanceIds,
    InstanceState,
    ListQuery,
    LogHeaders,
    SleepQuery,
    VllmConfig,
    WatchEvent,
    WatchQuery,
)
from api.openapi import DOCS_PATH, OPENAPI_PATH, TEXT, Content, Operation, Reply, documented, serve_openapi
from api.token_file import TokenFile

from . import request_parsing
from .dialect import Dialect
from .errors import LauncherError, PayloadTooLarge, RangeNotSatisfiable, Unauthorized
from .instances import InstanceManager
from .logs import FIRST_PAGE, content_range, log_size, parse_range, read_range, resolve_range

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MANAGER = web.AppKey("manager", InstanceManager)
TOKEN: web.AppKey[TokenFile | None] = web.AppKey("token")
DIALECT = web.AppKey("dialect", Dialect)
# Read-only routes that change nothing and tell no secret: health, the API's description, and the metrics
# (Prometheus scrapes them without the write token, docs/security.md).
UNAUTHENTICATED_PATHS = frozenset({"/health", "/metrics", OPENAPI_PATH, DOCS_PATH})
HEARTBEAT = b"\n"
OCTET_STREAM = "application/octet-stream"
# The reasons of the errors aiohttp itself raises (unknown routes, methods, oversized bodies).
HTTP_REASONS = {404: ErrorReason.NOT_FOUND, 405: ErrorReason.METHOD_NOT_ALLOWED}

ERROR = Content(ErrorBody)
NOT_FOUND = Reply("no such instance (`NotFound`)", ERROR)
INVALID = Reply("a query parameter of the wrong type: FastAPI's list of issues under `detail`", ERROR)
CREATE_REPLIES = {
    201: Reply("created; the state of the new instance (`running`)", Content(InstanceState)),
    400: Reply("options the runtime refuses (`InvalidOptions`), an unknown GPU (`UnknownGPU`), a field over its "
               "bound or an environment no process can have (`InvalidBody`); the detail names the value", ERROR),
    409: Reply("the port is taken (`PortInUse`)", ERROR),
    413: Reply("a body over 1 MiB", ERROR),
    422: Reply("a body that is not JSON or not a VllmConfig: FastAPI's list of issues under `detail`", ERROR),
}  # fmt: skip
CREATE_BODY = Content(VllmConfig, max_bytes=1024 * 1024)
FORWARDED_REPLIES = {
    200: Reply("done; the instance's state", Content(InstanceState)),
    404: NOT_FOUND,
    409: Reply("the instance is stopped (`NotRunning`) or still starting (`NotReady`)", ERROR),
    502: Reply("its server failed the call, or died in it (`BackendFailed`)", ERROR),
    504: Reply("its server did not answer in time (`BackendTimeout`)", ERROR),
}


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(body), status=status, content_type="application/json")


def _dialect(request: web.Request) -> Dialect:
    return request.app[DIALECT]


def _manager(request: web.Request) -> InstanceManager:
    return request.app[MANAGER]


def error_response(
    dialect: Dialect, status: int, detail: Any, reason: ErrorReason, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        text=json.dumps(dialect.error(detail, reason)), status=status, headers=headers, content_type="application/json"
    )


@web.middleware
async def count_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    request.app[MANAGER].metrics.http_requests.labels(route, request.method, str(response.status)).inc()
    return response


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    dialect = _dialect(request)
    try:
        return await handler(request)
    except RangeNotSatisfiable as err:
        unsatisfied = {"Content-Range": f"bytes */{err.total}"}
        if dialect.fma_only:  # FMA's 416 has no body
            return web.Response(status=err.status, headers=unsatisfied, content_type=OCTET_STREAM)
        return error_response(dialect, err.status, err.detail, err.reason, unsatisfied)
    except LauncherError as err:
        return error_response(dialect, err.status, err.detail, err.reason, err.headers)
    except web.HTTPException as err:
        reason = HTTP_REASONS.get(err.status, ErrorReason.INVALID_BODY if err.status < 500 else ErrorReason.INTERNAL)
        headers = {"Allow": err.headers["Allow"]} if "Allow" in err.headers else None
        return error_response(dialect, err.status, err.reason, reason, headers)
    except Exception as err:  # a bug must not take the API down; say what happened
        log.exception("%s %s failed", request.method, request.path)
        return error_response(dialect, 500, f"internal error: {err!r}", ErrorReason.INTERNAL)


@web.middleware
async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
    token = request.app[TOKEN]
    if token is not None and request.path not in UNAUTHENTICATED_PATHS:
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        if scheme != "Bearer" or not token.accepts(presented):
            raise Unauthorized("missing or wrong bearer token")
    return await handler(request)


async def _vllm_config(request: web.Request) -> VllmConfig:
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge as err:
        raise PayloadTooLarge(err.text or "the body is too large") from None
    return _dialect(request).config(request_parsing.vllm_config(body))


@documented(Operation("The launcher's name, version and routes", {200: Reply("the index", Content(Index))}))
async def index(request: web.Request) -> web.Response:
    """Each route by name as `"METHOD /path"`: FMA's ten first, then the ones this launcher adds (FMA serves its
    OpenAPI document and page too, without listing them)."""
    endpoints = {route.name: f"{route.method} {route.path}" for route in request.app[ROUTE_TABLE]}
    if not _dialect(request).fma_only:
        endpoints |= {"openapi": f"GET {OPENAPI_PATH}", "docs": f"GET {DOCS_PATH}"}
    return json_response(Index(endpoints=endpoints).model_dump())


@documented(Operation("200 while the launcher serves", {200: Reply("alive", Content(Health))}))
async def health(request: web.Request) -> web.Response:
    return json_response(Health().model_dump())


@documented(Operation("Prometheus metrics of the launcher (no token needed)", {200: Reply("Prometheus text", TEXT)}))
async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(_manager(request).metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


@documented(Operation("Create an instance with a new ID (a UUID)", CREATE_REPLIES, body=CREATE_BODY, bearer=True))
async def create_instance(request: web.Request) -> web.Response:
    state = await _manager(request).create(await _vllm_config(request))
    return json_response(_dialect(request).state(state), status=201)


@documented(Operation(
    "Create an instance with this ID",
    {**CREATE_REPLIES,
     400: Reply(f"{CREATE_REPLIES[400].description}; an ID that is not 1-128 of [A-Za-z0-9_.-] starting with a "
                "letter or digit", ERROR),
     409: Reply("the ID exists (`AlreadyExists`), or the port is taken (`PortInUse`)", ERROR)},
    body=CREATE_BODY, bearer=True,
))  # fmt: skip
async def create_named_instance(request: web.Request) -> web.Response:
    state = await _manager(request).create(await _vllm_config(request), request.match_info["instance_id"])
    return json_response(_dialect(request).state(state), status=201)


@documented(Operation(
    "Every instance: their states (detail=true), or their IDs",
    {200: Reply("the revision and the instances", Content(AllInstancesState | InstanceIds)), 422: INVALID},
    query=ListQuery, bearer=True,
))  # fmt: skip
async def list_instances(request: web.Request) -> web.Response:
    manager, dialect = _manager(request), _dialect(request)
    if request_parsing.query(request.query, ListQuery).detail:
        return json_response(dialect.listing(await manager.list_detailed()))
    return json_response(dialect.ids(manager.list_ids()))


@documented(Operation("One instance's state", {200: Reply("its state", Content(InstanceState)), 404: NOT_FOUND},
                      bearer=True))  # fmt: skip
async def get_instance(request: web.Request) -> web.Response:
    return json_response(_dialect(request).state(await _manager(request).state(request.match_info["instance_id"])))


@documented(Operation("Stop an instance (SIGTERM, SIGKILL after the grace period) and forget it",
                      {200: Reply("its last state (`stopped`)", Content(InstanceState)), 404: NOT_FOUND},
                      bearer=True))  # fmt: skip
async def delete_instance(request: web.Request) -> web.Response:
    return json_response(_dialect(request).state(await _manager(request).delete(request.match_info["instance_id"])))


@documented(Operation("Stop and forget every instance", {200: Reply("what was stopped", Content(DeleteAllResult))},
                      bearer=True))  # fmt: skip
async def delete_all_instances(request: web.Request) -> web.Response:
    result = await _manager(request).delete_all()
    dialect = _dialect(request)
    shown = result.model_dump(mode="json", exclude={"stopped_instances"})
    return json_response(shown | {"stopped_instances": [dialect.state(s) for s in result.stopped_instances]})


@documented(Operation("Put an instance to sleep (vLLM's /sleep)", {**FORWARDED_REPLIES, 422: INVALID},
                      query=SleepQuery, bearer=True, tags=("dualpods",)))  # fmt: skip
async def sleep_instance(request: web.Request) -> web.Response:
    level = request_parsing.query(request.query, SleepQuery).level
    state = await _manager(request).sleep(request.match_info["instance_id"], level)
    return json_response(_dialect(request).state(state))


@documented(Operation("Wake an instance (vLLM's /wake_up), checked against its probe before it is reported awake",
                      FORWARDED_REPLIES, bearer=True, tags=("dualpods",)))  # fmt: skip
async def wake_instance(request: web.Request) -> web.Response:
    return json_response(_dialect(request).state(await _manager(request).wake(request.match_info["instance_id"])))


@documented(Operation(
    "Bytes of an instance's log (its server's stdout and stderr)",
    {200: Reply("without Range: the first 1 MiB", Content(media_type=OCTET_STREAM),
                {"Content-Range": "bytes 0-END/TOTAL", "Accept-Ranges": "bytes"}),
     206: Reply("the range asked for (at most 1 MiB for an open end)", Content(media_type=OCTET_STREAM),
                {"Content-Range": "bytes START-END/TOTAL", "Accept-Ranges": "bytes"}),
     400: Reply("a malformed Range (a suffix range, another unit, END before START), before the ID is looked up",
                ERROR),
     404: NOT_FOUND,
     416: Reply("the range starts at or beyond the end of the log (an empty log too)", ERROR,
                {"Content-Range": "bytes */TOTAL"})},
    headers=LogHeaders, bearer=True,
))  # fmt: skip
async def instance_log(request: web.Request) -> web.Response:
    range_header = request.headers.get("Range")
    requested = parse_range(range_header) if range_header is not None else FIRST_PAGE
    path = _manager(request).get(request.match_info["instance_id"]).log_path
    byte_range = resolve_range(requested, log_size(path))
    data = read_range(path, byte_range)
    headers = {"Accept-Ranges": "bytes", "Content-Range": content_range(byte_range.start, data, byte_range.total)}
    status = 200 if range_header is None else 206
    return web.Response(status=status, body=data, headers=headers, content_type=OCTET_STREAM)


@documented(Operation(
    "Instance events as NDJSON, from a revision on",
    {200: Reply("one event per line, for as long as the client reads", Content(WatchEvent, "application/x-ndjson")),
     410: Reply("`since` is not in the launcher's history (`RevisionGone`): list again", ERROR),
     422: INVALID},
    query=WatchQuery, bearer=True,
))  # fmt: skip
async def watch_instances(request: web.Request) -> web.StreamResponse:
    manager, dialect = _manager(request), _dialect(request)
    since = request_parsing.query(request.query, WatchQuery).since
    events = manager.events
    if since is None:
        initial = [events.event(EventType.CREATED, state) for state in manager.snapshot()]
    else:
        initial = events.replay_since(since)
    subscription = events.subscribe(initial)
    heartbeat_s = None if dialect.fma_only else WATCH_HEARTBEAT_S  # FMA's streams are silent
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", "X-Content-Type-Options": "nosniff"})
    try:
        await response.prepare(request)
        while True:
            try:
                event = await subscription.next(heartbeat_s)
            except TimeoutError:
                await response.write(HEARTBEAT)
                continue
            if event is None:
                break
            await response.write(json.dumps(dialect.event(event)).encode() + b"\n")
    except ConnectionResetError:
        pass  # the watcher went away
    finally:
        subscription.close()
    return response


@dataclass(frozen=True)
class Route:
    name: str  # in the index
    method: str
    path: str
    handler: Handler
    addition: bool = False  # dualpods' own, absent in the FMA-only mode


_BASE = INSTANCES_PATH
_ONE = f"{_BASE}/{{instance_id}}"
# FMA's routes in the order of its index, then ours. `watch` is registered before `{instance_id}`, which would
# match it too.
ROUTES = [
    Route("index", "GET", "/", index),
    Route("health", "GET", "/health", health),
    Route("create_instance", "POST", _BASE, create_instance),
    Route("create_named_instance", "PUT", _ONE, create_named_instance),
    Route("delete_instance", "DELETE", _ONE, delete_instance),
    Route("delete_all_instances", "DELETE", _BASE, delete_all_instances),
    Route("get_instance_status", "GET", _ONE, get_instance),
    Route("get_all_instances", "GET", _BASE, list_instances),
    Route("get_instance_logs", "GET", f"{_ONE}/log", instance_log),
    Route("watch_instances", "GET", f"{_BASE}/watch", watch_instances),
    Route("metrics", "GET", "/metrics", metrics, addition=True),
    Route("sleep_instance", "POST", f"{_ONE}/sleep", sleep_instance, addition=True),
    Route("wake_instance", "POST", f"{_ONE}/wake_up", wake_instance, addition=True),
]
ROUTE_TABLE = web.AppKey("routes", list[Route])
_REGISTRATION_ORDER = sorted(ROUTES, key=lambda route: not route.path.endswith("/watch"))
DESCRIPTION = (
    "The launcher of dualpods: FMA 0.6's launcher API (its routes, bodies, status codes and events), plus "
    "dualpods' additions (tag `dualpods`), which an FMA-only launcher (`--fma-only`) does not serve."
)


def build_app(
    manager: InstanceManager, token: TokenFile | None = None, dialect: Dialect | None = None
) -> web.Application:
    dialect = dialect or Dialect()
    app = web.Application(middlewares=[count_requests, errors_as_json, require_token])
    app[MANAGER] = manager
    app[TOKEN] = token
    app[DIALECT] = dialect
    served = [route for route in ROUTES if not (route.addition and dialect.fma_only)]
    app[ROUTE_TABLE] = served
    for route in _REGISTRATION_ORDER:
        if route in served:
            app.router.add_route(route.method, route.path, route.handler)
    bearer = "the launcher's token (`--auth-token-file`)" if token else None
    serve_openapi(app, API_TITLE, API_VERSION, DESCRIPTION, bearer_description=bearer)

    async def stop_instances(app: web.Application) -> None:
        await manager.shutdown()

    app.on_shutdown.append(stop_instances)
    return app
