"""vLLM's routes over a runtime's `Engine`: health, models, OpenAI inference, dev sleep/wake, LoRA, metrics.

Every input the surface owns is checked before the engine sees it (the JSON, the sleep level and mode, the
wake tags, the LoRA bodies); a refusal anywhere is a 4xx in OpenAI's error shape naming what was wrong (as
vLLM's), and an unexpected failure a 500 in the same shape, never a dropped connection. The inference
bodies are the engine's to check: each runtime takes its own (`Engine.answer`).
"""

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError

from api.openai_errors import ApiError, ErrorBody
from api.openapi import TEXT, Content, Operation, Reply, documented, serve_openapi
from api.validation import first_problem
from api.vllm_surface.bodies import (
    SLEEP_LEVELS,
    SLEEP_MODES,
    WAKE_TAGS,
    IsSleepingReply,
    LoadLoraAdapterRequest,
    ModelList,
    SleepQuery,
    SleepReply,
    UnloadLoraAdapterRequest,
    WakeQuery,
    WakeReply,
)
from api.vllm_surface.engine import Adapters, Answer, Chunk, Engine

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)
ENGINE: web.AppKey[Engine] = web.AppKey("engine")
ADAPTERS: web.AppKey[Adapters | None] = web.AppKey("adapters")

ERROR = Content(ErrorBody)
BAD_REQUEST = Reply("a body or parameter that is not valid; the message names it", ERROR)
INTERNAL = Reply("the model failed", ERROR)


@dataclass(frozen=True)
class Documentation:
    """The surface's OpenAPI document (`/openapi.json`, `/docs`): the runtime's title, and its inference routes,
    described by the runtime since their bodies are its own."""

    title: str
    version: str
    description: str
    completions: Operation
    chat_completions: Operation


def parse_body(model: type[M], body: object) -> M:
    """`body` as `model`, or a 400 naming the first thing wrong with it."""
    try:
        return model.model_validate(body)
    except ValidationError as error:
        where, message = first_problem(error)
        raise ApiError(400, f"{where}: {message}" if where else message, where or None) from None


async def _json_body(request: web.Request) -> object:
    try:
        return json.loads(await request.read())
    except (ValueError, RecursionError) as error:  # not JSON, not UTF-8, or absurdly deep
        raise ApiError(400, f"JSON decode error: {error}", "body") from None


# Inference -----------------------------------------------------------------------------------------


class _SseStream:
    """Server-sent events the way OpenAI (and vLLM) stream: `data: <json>` per chunk, `data: [DONE]` last."""

    def __init__(self, response: web.StreamResponse) -> None:
        self.response = response

    @classmethod
    async def open(cls, request: web.Request) -> "_SseStream":
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        return cls(response)

    async def send(self, chunk: Chunk) -> None:
        await self._write(chunk.model_dump_json() if isinstance(chunk, BaseModel) else json.dumps(chunk))

    async def send_error(self, error: ApiError) -> None:
        """After the 200 went out, an error can only travel as an event (vLLM sends it the same way)."""
        await self._write(json.dumps(error.payload()))

    async def close(self) -> web.StreamResponse:
        await self._write("[DONE]")
        await self.response.write_eof()
        return self.response

    async def _write(self, data: str) -> None:
        await self.response.write(f"data: {data}\n\n".encode())


async def _stream(request: web.Request, answer: Answer) -> web.StreamResponse:
    sse = await _SseStream.open(request)
    try:
        try:
            async for chunk in answer.chunks():
                await sse.send(chunk)
        except ApiError as error:
            await sse.send_error(error)
        return await sse.close()
    except ConnectionResetError:  # the client left; leaving the answer's context stops the generation
        return sse.response


async def _inference(request: web.Request, chat: bool) -> web.StreamResponse:
    body = await _json_body(request)
    async with request.app[ENGINE].answer(body, chat) as answer:
        if answer.stream:
            return await _stream(request, answer)
        return web.json_response(await answer.whole())


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _inference(request, chat=False)


async def _chat_completions(request: web.Request) -> web.StreamResponse:
    return await _inference(request, chat=True)


# Models, health, metrics ---------------------------------------------------------------------------


@documented(Operation("The served model names and loaded LoRA adapters", {200: Reply("the cards", Content(ModelList))}))
async def _models(request: web.Request) -> web.Response:
    return web.json_response(ModelList(data=request.app[ENGINE].models()).model_dump(mode="json"))


@documented(Operation("200 once serving, asleep or not", {200: Reply("alive")}))
async def _health(request: web.Request) -> web.Response:
    """200 once serving, asleep or not, as vLLM's: the weights are gone at level 2, but the server is alive."""
    return web.Response()


@documented(Operation("Prometheus metrics", {200: Reply("Prometheus text", TEXT)}))
async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[ENGINE].metrics_registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


# Sleep and wake ------------------------------------------------------------------------------------

SleepListener = Callable[[bool], None]
# Told whether the engine sleeps after each sleep and wake, before it is answered: the launcher that forked this
# server learns of a sleep asked of it directly before its client can ask the launcher (`launcher.sleep_reports`).
_sleep_listeners: list[SleepListener] = []


def on_sleep_change(listener: SleepListener) -> None:
    _sleep_listeners.append(listener)


def _sleep_changed(engine: Engine) -> None:
    for listener in _sleep_listeners:
        listener(engine.is_sleeping)


@documented(Operation("vLLM's dev-mode sleep", {200: Reply("asleep", Content(SleepReply)), 400: BAD_REQUEST},
                      query=SleepQuery, tags=("sleep",)))  # fmt: skip
async def _sleep(request: web.Request) -> web.Response:
    raw_level = request.query.get("level", "1")
    if raw_level not in {str(level) for level in SLEEP_LEVELS}:
        raise ApiError(400, f"level must be 0, 1 or 2, got {raw_level!r}.", "query.level")
    level = int(raw_level)
    raw_mode = request.query.get("mode", "abort")
    mode = next((mode for mode in SLEEP_MODES if mode == raw_mode), None)
    if mode is None:
        raise ApiError(400, f"mode must be abort or wait, got {raw_mode!r}; keep is not supported here.", "query.mode")
    await request.app[ENGINE].sleep(level, mode)
    _sleep_changed(request.app[ENGINE])
    return web.json_response(SleepReply(level=level).model_dump())


@documented(Operation("vLLM's dev-mode wake", {200: Reply("awake, or partly", Content(WakeReply)), 400: BAD_REQUEST,
                                               500: INTERNAL}, query=WakeQuery, tags=("sleep",)))  # fmt: skip
async def _wake_up(request: web.Request) -> web.Response:
    tags = request.query.getall("tags", None)
    if tags is not None and (unknown := set(tags) - WAKE_TAGS):
        raise ApiError(400, f"unknown tags {sorted(unknown)}; the tags are {sorted(WAKE_TAGS)}.", "query.tags")
    awake = await request.app[ENGINE].wake_up(tags)
    _sleep_changed(request.app[ENGINE])
    return web.json_response(WakeReply(status="awake" if awake else "sleeping", tags=tags).model_dump())


@documented(Operation("Whether the engine sleeps", {200: Reply("", Content(IsSleepingReply))}, tags=("sleep",)))
async def _is_sleeping(request: web.Request) -> web.Response:
    return web.json_response(IsSleepingReply(is_sleeping=request.app[ENGINE].is_sleeping).model_dump())


# LoRA ----------------------------------------------------------------------------------------------


def _lora_operation(summary: str, done: str, refused: str, body: type[BaseModel]) -> Operation:
    replies = {200: Reply(done, TEXT), 400: BAD_REQUEST, 404: Reply(refused, ERROR), 500: INTERNAL}
    return Operation(summary, replies, body=Content(body), tags=("lora",))


async def _lora_request(request: web.Request, body_type: type[M]) -> tuple[Adapters, M]:
    """The engine's adapters (a 404 first where LoRA is not enabled) and the request's body."""
    adapters = request.app[ADAPTERS]
    if adapters is None:
        raise ApiError(404, "LoRA adapters are not enabled on this server; start it with --enable-lora.")
    return adapters, parse_body(body_type, await _json_body(request))


@documented(_lora_operation("vLLM's runtime LoRA load (with --enable-lora)", "loaded",
                            "LoRA not enabled, or no adapter at the path", LoadLoraAdapterRequest))  # fmt: skip
async def _load_lora_adapter(request: web.Request) -> web.Response:
    adapters, body = await _lora_request(request, LoadLoraAdapterRequest)
    await adapters.load(body.lora_name, body.lora_path)
    return web.Response(text=f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@documented(_lora_operation("vLLM's runtime LoRA unload (with --enable-lora)", "unloaded",
                            "LoRA not enabled, or no such adapter", UnloadLoraAdapterRequest))  # fmt: skip
async def _unload_lora_adapter(request: web.Request) -> web.Response:
    adapters, body = await _lora_request(request, UnloadLoraAdapterRequest)
    await adapters.unload(body.lora_name)
    return web.Response(text=f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


# The application -----------------------------------------------------------------------------------


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """OpenAI error bodies for everything a handler raises; a failure never takes the server down."""
    try:
        return await handler(request)
    except ApiError as error:
        return error.response()
    except web.HTTPException as error:  # no route (404), wrong method (405), a body over the limit (413)
        if error.status < 400:
            raise
        allow = {"Allow": error.headers["Allow"]} if "Allow" in error.headers else None
        message = f"{request.method} {request.path}: {error.text or error.reason}"
        return ApiError(error.status, message, headers=allow).response()
    except Exception as error:
        log.exception("%s %s failed", request.method, request.path)
        return ApiError(500, f"{type(error).__name__}: {error}", err_type="InternalServerError").response()


def create_app(
    engine: Engine,
    adapters: Adapters | None = None,
    *,
    middlewares: Sequence[Middleware] = (),
    documentation: Documentation | None = None,
) -> web.Application:
    """vLLM's surface over `engine`; `adapters`: the LoRA routes' (None: LoRA is not enabled); `middlewares` run
    outside the error middleware (they see the status every request is answered with)."""
    app = web.Application(middlewares=[*middlewares, _errors])
    app[ENGINE] = engine
    app[ADAPTERS] = adapters
    for path in ("/health", "/healthz"):
        app.router.add_get(path, _health)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _chat_completions)
    app.router.add_post("/sleep", _sleep)
    app.router.add_post("/wake_up", _wake_up)
    app.router.add_get("/is_sleeping", _is_sleeping)
    app.router.add_post("/v1/load_lora_adapter", _load_lora_adapter)
    app.router.add_post("/v1/unload_lora_adapter", _unload_lora_adapter)
    if documentation is not None:
        inference: dict[Handler, Operation] = {
            _completions: documentation.completions,
            _chat_completions: documentation.chat_completions,
        }
        serve_openapi(app, documentation.title, documentation.version, documentation.description, operations=inference)
    return app
