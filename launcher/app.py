"""The launcher's HTTP API (aiohttp): FMA's `/v2/vllm/instances` routes plus sleep/wake (E1).

A thin layer: each handler parses its input, calls the instance manager, and serializes the
result; errors become `{"detail": ..., "reason": ...}` bodies with the status and reason their
exception names. A watch stream that has nothing to send sends an empty line every
WATCH_HEARTBEAT_S, so both ends can tell a quiet stream from a dead connection.
"""

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError

from api.launcher import (
    INSTANCES_PATH,
    WATCH_HEARTBEAT_S,
    ErrorBody,
    ErrorReason,
    EventType,
    Health,
    Index,
    VllmConfig,
)
from api.token_file import TokenFile

from .errors import BadRequest, LauncherError, PayloadTooLarge, RangeNotSatisfiable, Unauthorized, Unprocessable
from .instances import InstanceManager
from .logs import log_size, read_range, resolve_range

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MANAGER = web.AppKey("manager", InstanceManager)
TOKEN: web.AppKey[TokenFile | None] = web.AppKey("token")
CHUNK_BYTES = 64 * 1024
UNAUTHENTICATED_PATHS = frozenset({"/health"})
HEARTBEAT = b"\n"
# The reasons of the errors aiohttp itself raises (unknown routes, methods, oversized bodies).
HTTP_REASONS = {404: ErrorReason.NOT_FOUND, 405: ErrorReason.METHOD_NOT_ALLOWED}


def json_response(model: BaseModel, status: int = 200) -> web.Response:
    return web.Response(text=model.model_dump_json(exclude_none=True), status=status, content_type="application/json")


def error_response(
    status: int, detail: str, reason: ErrorReason, headers: dict[str, str] | None = None
) -> web.Response:
    body = ErrorBody(detail=detail, reason=reason).model_dump_json()
    return web.Response(text=body, status=status, headers=headers, content_type="application/json")


@web.middleware
async def count_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    request.app[MANAGER].metrics.http_requests.labels(route, request.method, str(response.status)).inc()
    return response


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RangeNotSatisfiable as err:
        return web.Response(status=err.status, headers={"Content-Range": f"bytes */{err.total}"})
    except LauncherError as err:
        return error_response(err.status, err.message, err.reason, err.headers)
    except web.HTTPException as err:
        reason = HTTP_REASONS.get(err.status, ErrorReason.INVALID_BODY if err.status < 500 else ErrorReason.INTERNAL)
        headers = {"Allow": err.headers["Allow"]} if "Allow" in err.headers else None
        return error_response(err.status, err.reason, reason, headers)
    except Exception as err:  # a bug must not take the API down; say what happened
        log.exception("%s %s failed", request.method, request.path)
        return error_response(500, f"internal error: {err!r}", ErrorReason.INTERNAL)


@web.middleware
async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
    token = request.app[TOKEN]
    if token is not None and request.path not in UNAUTHENTICATED_PATHS:
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        if scheme != "Bearer" or not token.accepts(presented):
            raise Unauthorized("missing or wrong bearer token")
    return await handler(request)


def _query_int(request: web.Request, name: str) -> int | None:
    raw = request.query.get(name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise BadRequest(f"query parameter {name}={raw!r} is not an integer") from None


def _query_bool(request: web.Request, name: str, default: bool) -> bool:
    raw = request.query.get(name)
    if raw is None:
        return default
    if raw.lower() in ("true", "1", "yes"):
        return True
    if raw.lower() in ("false", "0", "no"):
        return False
    raise BadRequest(f"query parameter {name}={raw!r} is not a boolean (true or false)")


async def _vllm_config(request: web.Request) -> VllmConfig:
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge as err:
        raise PayloadTooLarge(err.text or "the body is too large") from None
    try:
        return VllmConfig.model_validate_json(body)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in err.errors())
        if any(e["type"] == "json_invalid" for e in err.errors()):
            raise BadRequest(f"malformed JSON body: {problems}") from None
        raise Unprocessable(f"invalid instance configuration: {problems}") from None


def _manager(request: web.Request) -> InstanceManager:
    return request.app[MANAGER]


async def index(request: web.Request) -> web.Response:
    """The routes by name; the instance routes with their method, as FMA lists them."""
    endpoints = {"index": "/"} | {
        name: f"{route.method} {route.path}" if route.path.startswith(INSTANCES_PATH) else route.path
        for name, route in ROUTES
    }
    return json_response(Index(name="dualpods launcher", endpoints=endpoints))


async def health(request: web.Request) -> web.Response:
    return json_response(Health())


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(_manager(request).metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def create_instance(request: web.Request) -> web.Response:
    state = await _manager(request).create(await _vllm_config(request))
    return json_response(state, status=201)


async def create_named_instance(request: web.Request) -> web.Response:
    state = await _manager(request).create(await _vllm_config(request), request.match_info["instance_id"])
    return json_response(state, status=201)


async def list_instances(request: web.Request) -> web.Response:
    manager = _manager(request)
    if _query_bool(request, "detail", default=True):
        return json_response(await manager.list_detailed())
    return json_response(manager.list_ids())


async def get_instance(request: web.Request) -> web.Response:
    return json_response(await _manager(request).state(request.match_info["instance_id"]))


async def delete_instance(request: web.Request) -> web.Response:
    return json_response(await _manager(request).delete(request.match_info["instance_id"]))


async def delete_all_instances(request: web.Request) -> web.Response:
    return json_response(await _manager(request).delete_all())


async def sleep_instance(request: web.Request) -> web.Response:
    level = _query_int(request, "level")
    instance_id = request.match_info["instance_id"]
    return json_response(await _manager(request).sleep(instance_id, 1 if level is None else level))


async def wake_instance(request: web.Request) -> web.Response:
    return json_response(await _manager(request).wake(request.match_info["instance_id"]))


async def instance_log(request: web.Request) -> web.StreamResponse:
    instance = _manager(request).get(request.match_info["instance_id"])
    total = log_size(instance.log_path)
    headers = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
    range_header = request.headers.get("Range")
    if range_header is not None:
        byte_range = resolve_range(range_header, total)
        headers["Content-Range"] = byte_range.content_range
        return web.Response(status=206, body=read_range(instance.log_path, byte_range), headers=headers)
    response = web.StreamResponse(status=200, headers=headers)
    response.content_length = total
    await response.prepare(request)
    if total:
        with instance.log_path.open("rb") as log_file:
            remaining = total
            while remaining and (chunk := log_file.read(min(CHUNK_BYTES, remaining))):
                remaining -= len(chunk)
                await response.write(chunk)
    await response.write_eof()
    return response


async def watch_instances(request: web.Request) -> web.StreamResponse:
    manager = _manager(request)
    since = _query_int(request, "since")
    events = manager.events
    if since is None:
        initial = [events.event(EventType.CREATED, state) for state in manager.snapshot()]
    else:
        initial = events.replay_since(since)
    subscription = events.subscribe(initial)
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", "X-Content-Type-Options": "nosniff"})
    try:
        await response.prepare(request)
        while True:
            try:
                event = await subscription.next(WATCH_HEARTBEAT_S)
            except TimeoutError:
                await response.write(HEARTBEAT)
                continue
            if event is None:
                break
            await response.write(event.model_dump_json(exclude_none=True).encode() + b"\n")
    except ConnectionResetError:
        pass  # the watcher went away
    finally:
        subscription.close()
    return response


_BASE = INSTANCES_PATH
_ONE = f"{_BASE}/{{instance_id}}"
# (name in the index, route); `watch` before `{instance_id}`, which would match it too.
ROUTES: list[tuple[str, web.RouteDef]] = [
    ("health", web.get("/health", health)),
    ("metrics", web.get("/metrics", metrics)),
    ("create_instance", web.post(_BASE, create_instance)),
    ("get_all_instances", web.get(_BASE, list_instances)),
    ("delete_all_instances", web.delete(_BASE, delete_all_instances)),
    ("watch_instances", web.get(f"{_BASE}/watch", watch_instances)),
    ("create_named_instance", web.put(_ONE, create_named_instance)),
    ("get_instance_status", web.get(_ONE, get_instance)),
    ("delete_instance", web.delete(_ONE, delete_instance)),
    ("get_instance_logs", web.get(f"{_ONE}/log", instance_log)),
    ("sleep_instance", web.post(f"{_ONE}/sleep", sleep_instance)),
    ("wake_instance", web.post(f"{_ONE}/wake_up", wake_instance)),
]


def build_app(manager: InstanceManager, token: TokenFile | None = None) -> web.Application:
    app = web.Application(middlewares=[count_requests, errors_as_json, require_token])
    app[MANAGER] = manager
    app[TOKEN] = token
    app.router.add_get("/", index)
    app.router.add_routes([route for _, route in ROUTES])

    async def stop_instances(app: web.Application) -> None:
        await manager.shutdown()

    app.on_shutdown.append(stop_instances)
    return app
