"""The stand-in's HTTP surface: vLLM's health, models, OpenAI inference, dev sleep/wake and metrics."""

import json
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.openai_errors import ApiError
from standin.engine import Engine
from standin.openai_bodies import Job

ENGINE = web.AppKey("engine", Engine)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _api_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as error:
        return error.response()


async def _health(request: web.Request) -> web.Response:
    return web.Response()


async def _models(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    cards: list[dict[str, object]] = [
        {
            "id": name,
            "object": "model",
            "owned_by": "vllm",
            "root": engine.root,
            "parent": None,
            "max_model_len": engine.max_model_len,
            "permission": [],
        }
        for name in engine.served_names
    ]
    return web.json_response({"object": "list", "data": cards})


async def _inference(request: web.Request, chat: bool) -> web.StreamResponse:
    engine = request.app[ENGINE]
    try:
        body = await request.json()
    except json.JSONDecodeError as error:
        raise ApiError(400, f"JSON decode error: {error}", "body") from error
    job = Job.parse(body, chat, engine.served_names, engine.corruption)
    async with engine.admit():
        if not job.stream:
            return web.json_response(job.response())
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await stream.prepare(request)
        for chunk in job.chunks():
            await stream.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await stream.write(b"data: [DONE]\n\n")
        await stream.write_eof()
        return stream


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _inference(request, chat=False)


async def _chat_completions(request: web.Request) -> web.StreamResponse:
    return await _inference(request, chat=True)


async def _sleep(request: web.Request) -> web.Response:
    raw = request.query.get("level", "1")
    if raw not in ("0", "1", "2"):
        raise ApiError(400, f"level must be an integer from 0 to 2, got {raw!r}.", "query.level")
    level = int(raw)
    await request.app[ENGINE].sleep(level)
    return web.json_response({"status": "sleeping", "level": level})


async def _wake_up(request: web.Request) -> web.Response:
    # vLLM can wake only some parts (`?tags=weights`); the stand-in always wakes fully.
    await request.app[ENGINE].wake_up()
    return web.json_response({"status": "awake", "tags": request.query.getall("tags", None)})


async def _is_sleeping(request: web.Request) -> web.Response:
    return web.json_response({"is_sleeping": request.app[ENGINE].is_sleeping})


async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[ENGINE].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def create_app(engine: Engine) -> web.Application:
    app = web.Application(middlewares=[_api_errors])
    app[ENGINE] = engine
    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _chat_completions)
    app.router.add_post("/sleep", _sleep)
    app.router.add_post("/wake_up", _wake_up)
    app.router.add_get("/is_sleeping", _is_sleeping)
    app.router.add_get("/metrics", _metrics)
    return app
