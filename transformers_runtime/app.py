"""The HTTP surface: vLLM's OpenAI routes, health, metrics, dev sleep/wake and LoRA load/unload.

Every input is checked before anything is queued for the model thread: a bad body, parameter or
size is a 400 naming it (an OpenAI error body, as vLLM's), never a 500. `/openapi.json` and `/docs`
describe every route, built from the pydantic models below (as vLLM serves them too).
"""

import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError

from api.openai_errors import ApiError, ErrorBody
from api.openapi import TEXT, Content, Operation, Reply, documented, serve_openapi
from api.validation import first_problem

from .batch import Prompt
from .engine import Done, Engine, Failed, GenerationJob, ModelContext
from .generation import Delta, TokenLogprob
from .logprobs import render
from .lora import Adapter, AdapterRegistry
from .metrics import Metrics
from .model import Checkpoint
from .protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatStreamChoice,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    IsSleepingReply,
    LoadLoraAdapterRequest,
    ModelCard,
    ModelList,
    SleepQuery,
    SleepReply,
    UnloadLoraAdapterRequest,
    Usage,
    WakeQuery,
    WakeReply,
    chat_completion_id,
    completion_id,
)
from .sleep import LEVELS, TAGS
from .streaming import SseStream
from .text import NoChatTemplate, TextCodec

log = logging.getLogger("transformers_runtime")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
M = TypeVar("M", bound=BaseModel)
SLEEP_MODES: dict[str, Literal["abort", "wait"]] = {"abort": "abort", "wait": "wait"}


@dataclass
class ServerState:
    served_names: list[str]
    checkpoint: Checkpoint
    context: ModelContext
    engine: Engine
    registry: AdapterRegistry
    metrics: Metrics
    lora_enabled: bool
    vocab_size: int
    max_num_seqs: int

    def resolve(self, name: str | None) -> tuple[str, Adapter | None]:
        """The name to answer with, and the adapter to generate with (None: the base model)."""
        if not name or name in self.served_names:
            return name or self.served_names[0], None
        adapter = self.registry.lookup(name)
        if adapter is None:
            raise ApiError(404, f"The model `{name}` does not exist.", "model")
        return name, adapter

    def sampling_defaults(self) -> tuple[float, float]:
        """vLLM takes temperature and top_p defaults from the model's generation_config.json."""
        defaults = self.checkpoint.generation_defaults
        return float(defaults.get("temperature", 1.0)), float(defaults.get("top_p", 1.0))


STATE = web.AppKey("state", ServerState)


ERROR = Content(ErrorBody)
BAD_REQUEST = Reply("a body or parameter that is not valid; the message names it", ERROR)
INTERNAL = Reply("the model failed", ERROR)
GENERATION_REPLIES = {
    400: BAD_REQUEST,
    404: Reply("no such model or adapter", ERROR),
    413: Reply("a body over 1 MiB", ERROR),
    429: Reply("too many requests wait already", ERROR),
    500: INTERNAL,
    503: Reply("asleep past --sleep-wait-timeout, or shutting down", ERROR),
}


def _parse(model: type[M], body: object) -> M:
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


def _prompt_ids(state: ServerState, request: CompletionRequest | ChatCompletionRequest) -> list[list[int]]:
    codec = state.context.codec
    if isinstance(request, ChatCompletionRequest):
        try:
            return [codec.render_chat(request.conversation(), request.add_generation_prompt)]
        except NoChatTemplate as error:
            raise ApiError(400, str(error), "messages") from None
    prompts = []
    for prompt in request.prompt:
        if isinstance(prompt, str):
            prompts.append(codec.encode(prompt, add_special_tokens=True))
        elif all(0 <= token < state.vocab_size for token in prompt):
            prompts.append(prompt)
        else:
            raise ApiError(400, f"Token ids must be in [0, {state.vocab_size}).", "prompt")
    return prompts


def _budget(state: ServerState, request: CompletionRequest | ChatCompletionRequest, ids: list[int]) -> Prompt:
    if not ids:  # vLLM's check; an empty prompt has no position to generate from
        raise ApiError(400, "The decoder prompt cannot be empty", "prompt")
    limit = state.checkpoint.max_model_len
    if len(ids) >= limit:
        raise ApiError(
            400,
            f"This model's maximum context length is {limit} tokens. However, your prompt contains {len(ids)} "
            "input tokens, which leaves no room for any output token. Please reduce the length of the input prompt.",
            "input_tokens",
        )
    return Prompt(ids, request.max_new_tokens(len(ids), limit))


async def _generate(request: web.Request, chat: bool) -> web.StreamResponse:
    state = request.app[STATE]
    body = await _json_body(request)
    parsed = _parse(ChatCompletionRequest, body) if chat else _parse(CompletionRequest, body)
    model_name, adapter = state.resolve(parsed.model)
    params = parsed.sampling(*state.sampling_defaults(), state.vocab_size)
    if params.n > state.max_num_seqs:  # vLLM would queue them; here they would all be one batch
        raise ApiError(400, f"n must be at most {state.max_num_seqs} (--max-num-seqs), got {params.n}.", "n")
    prompt_count = len(parsed.prompt) if isinstance(parsed, CompletionRequest) else 1
    sequences = params.n * prompt_count
    if sequences > state.max_num_seqs:
        raise ApiError(
            400,
            f"{prompt_count} prompts x n={params.n} are {sequences} sequences, more than the "
            f"{state.max_num_seqs} this server runs at once (--max-num-seqs).",
            "prompt",
        )
    prompts = [_budget(state, parsed, ids) for ids in _prompt_ids(state, parsed)]
    job = GenerationJob(prompts, params, adapter)
    await state.engine.submit(job)
    codec = state.context.codec if params.logprobs is not None else None
    reply = _Reply(chat, model_name, sum(len(p.token_ids) for p in prompts), job.choices, codec)
    reply.tokens_as_ids = parsed.return_tokens_as_token_ids
    if isinstance(parsed, CompletionRequest) and parsed.return_token_ids:
        reply.prompt_token_ids = [p.token_ids for p in prompts for _ in range(params.n)]
    try:
        if parsed.stream:
            return await _stream(request, job, reply, parsed.include_usage)
        async for event in job.events():
            if isinstance(event, Failed):
                raise ApiError(500, event.message, err_type="InternalServerError")
            if isinstance(event, Delta):
                reply.add(event)
        return web.json_response(reply.response().model_dump(mode="json"))
    finally:
        job.abort()  # a no-op once finished; stops the model thread when the client went away
        state.metrics.prompt_tokens.inc(reply.prompt_tokens)
        state.metrics.generation_tokens.inc(reply.completion_tokens)


class _Reply:
    """One request's answer, assembled from its deltas: whole, or chunk by chunk."""

    def __init__(self, chat: bool, model: str, prompt_tokens: int, choices: int, codec: TextCodec | None) -> None:
        """`codec` names the tokens of the logprobs; None when the request asked for none."""
        self.chat = chat
        self.codec = codec
        self.model = model
        self.id = chat_completion_id() if chat else completion_id()
        self.created = int(time.time())
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0
        self.texts = [""] * choices
        self.finished: list[Delta | None] = [None] * choices
        self.logprobs: list[list[TokenLogprob]] = [[] for _ in range(choices)]
        self.offsets = [0] * choices  # of a stream's next logprobs, in the choice's text
        self.tokens_as_ids = False  # name the logprobs' tokens `token_id:N`
        self.prompt_token_ids: list[list[int]] | None = None  # per choice, when the request asked for token ids

    def add(self, delta: Delta) -> None:
        self.texts[delta.index] += delta.text
        self.logprobs[delta.index] += delta.logprobs
        if delta.finish_reason is not None:
            self.finished[delta.index] = delta
            self.completion_tokens += delta.tokens

    def usage(self) -> Usage:
        return Usage.of(self.prompt_tokens, self.completion_tokens)

    def _logprobs(self, index: int, entries: Sequence[TokenLogprob]) -> Any:
        """Choice `index`'s logprobs for `entries` in the request's shape (None if it asked for none)."""
        if self.codec is None:
            return None
        logprobs, self.offsets[index] = render(self.codec, entries, self.chat, self.tokens_as_ids, self.offsets[index])
        return logprobs

    def response(self) -> CompletionResponse | ChatCompletionResponse:
        ends = [(d.finish_reason, d.stop_reason) if d else (None, None) for d in self.finished]
        logprobs = [self._logprobs(i, entries) for i, entries in enumerate(self.logprobs)]
        if self.chat:
            chat_choices = [
                ChatChoice(
                    index=i,
                    message=AssistantMessage(content=text),
                    logprobs=logprobs[i],
                    finish_reason=end,
                    stop_reason=stop,
                )
                for i, (text, (end, stop)) in enumerate(zip(self.texts, ends, strict=True))
            ]
            return ChatCompletionResponse(
                id=self.id, created=self.created, model=self.model, choices=chat_choices, usage=self.usage()
            )
        choices = [
            CompletionChoice(index=i, text=text, logprobs=logprobs[i], finish_reason=end, stop_reason=stop)
            for i, (text, (end, stop)) in enumerate(zip(self.texts, ends, strict=True))
        ]
        if self.prompt_token_ids is not None:
            for choice, prompt_ids, delta in zip(choices, self.prompt_token_ids, self.finished, strict=True):
                choice.prompt_token_ids = prompt_ids
                choice.token_ids = list(delta.token_ids) if delta else []
        return CompletionResponse(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=self.usage()
        )

    def chunk(self, delta: Delta, role: bool = False) -> BaseModel:
        """One streamed piece of a choice (`role`: the chat stream's opening one)."""
        index, text, end, stop = delta.index, delta.text, delta.finish_reason, delta.stop_reason
        logprobs = None if role else self._logprobs(index, delta.logprobs)
        if self.chat:
            content = {"role": "assistant", "content": text} if role else {"content": text}
            choice = ChatStreamChoice(
                index=index, delta=content, logprobs=logprobs, finish_reason=end, stop_reason=stop
            )
            return ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=[choice])
        piece = CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=end, stop_reason=stop)
        return CompletionResponse(id=self.id, created=self.created, model=self.model, choices=[piece])

    def usage_chunk(self) -> BaseModel:
        """The extra last chunk of `stream_options.include_usage`: no choices, only usage."""
        if self.chat:
            return ChatCompletionChunk(
                id=self.id, created=self.created, model=self.model, choices=[], usage=self.usage()
            )
        return CompletionResponse(id=self.id, created=self.created, model=self.model, choices=[], usage=self.usage())


async def _stream(request: web.Request, job: GenerationJob, reply: _Reply, include_usage: bool) -> web.StreamResponse:
    sse = await SseStream.open(request)
    try:
        if reply.chat:  # vLLM opens every chat choice with the role
            for index in range(job.choices):
                await sse.send(reply.chunk(Delta(index, ""), role=True))
        async for event in job.events():
            if isinstance(event, Failed):
                await sse.send_error(ApiError(500, event.message, err_type="InternalServerError"))
            elif isinstance(event, Done):
                if include_usage:
                    await sse.send(reply.usage_chunk())
            else:
                reply.add(event)
                if event.text or event.finish_reason:
                    await sse.send(reply.chunk(event))
        return await sse.close()
    except ConnectionResetError:  # the client left; `finally` in the caller stops the generation
        return sse.response


@documented(Operation("vLLM's legacy completions", {
    200: Reply("the completion; with `stream`, server-sent events of partial ones", Content(CompletionResponse)),
    **GENERATION_REPLIES}, body=Content(CompletionRequest), tags=("inference",)))  # fmt: skip
async def _completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


@documented(Operation("vLLM's chat completions (with the model's chat template)", {
    200: Reply("the completion; with `stream`, server-sent events of chunks", Content(ChatCompletionResponse)),
    **GENERATION_REPLIES}, body=Content(ChatCompletionRequest), tags=("inference",)))  # fmt: skip
async def _chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


# Models, health, metrics ---------------------------------------------------------------------------


@documented(Operation("The served model names and loaded LoRA adapters", {200: Reply("the cards", Content(ModelList))}))
async def _models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    root = str(state.checkpoint.path)
    cards = [ModelCard(id=name, root=root, max_model_len=state.checkpoint.max_model_len) for name in state.served_names]
    cards += [
        ModelCard(id=a.name, root=a.path, parent=a.base_model_name or state.served_names[0]) for a in state.registry
    ]
    return web.json_response(ModelList(data=cards).model_dump(mode="json"))


@documented(Operation("200 once serving, asleep or not", {200: Reply("alive")}))
async def _health(request: web.Request) -> web.Response:
    """200 once serving, asleep or not, as vLLM's: the weights are gone at level 2, but the server is alive."""
    return web.Response()


@documented(Operation("Prometheus metrics", {200: Reply("Prometheus text", TEXT)}))
async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[STATE].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


# Sleep and wake ------------------------------------------------------------------------------------


@documented(Operation("vLLM's dev-mode sleep", {200: Reply("asleep", Content(SleepReply)), 400: BAD_REQUEST},
                      query=SleepQuery, tags=("sleep",)))  # fmt: skip
async def _sleep(request: web.Request) -> web.Response:
    state = request.app[STATE]
    raw_level = request.query.get("level", "1")
    if raw_level not in {str(level) for level in LEVELS}:
        raise ApiError(400, f"level must be 0, 1 or 2, got {raw_level!r}.", "query.level")
    level = int(raw_level)
    raw_mode = request.query.get("mode", "abort")
    if raw_mode not in SLEEP_MODES:
        raise ApiError(400, f"mode must be abort or wait, got {raw_mode!r}; keep is not supported here.", "query.mode")
    with state.metrics.transition_seconds.labels("sleep", raw_level).time():
        await state.engine.sleep(level, SLEEP_MODES[raw_mode])
    return web.json_response(SleepReply(level=level).model_dump())


@documented(Operation("vLLM's dev-mode wake", {200: Reply("awake, or partly", Content(WakeReply)), 400: BAD_REQUEST,
                                               500: INTERNAL}, query=WakeQuery, tags=("sleep",)))  # fmt: skip
async def _wake_up(request: web.Request) -> web.Response:
    state = request.app[STATE]
    tags = request.query.getall("tags", None)
    if tags is not None and (unknown := set(tags) - TAGS):
        raise ApiError(400, f"unknown tags {sorted(unknown)}; the tags are {sorted(TAGS)}.", "query.tags")
    level = state.engine.sleep_level
    with state.metrics.transition_seconds.labels("wake", "awake" if level is None else str(level)).time():
        awake = await state.engine.wake_up(tags)
    return web.json_response(WakeReply(status="awake" if awake else "sleeping", tags=tags).model_dump())


@documented(Operation("Whether the engine sleeps", {200: Reply("", Content(IsSleepingReply))}, tags=("sleep",)))
async def _is_sleeping(request: web.Request) -> web.Response:
    return web.json_response(IsSleepingReply(is_sleeping=request.app[STATE].engine.is_sleeping).model_dump())


# LoRA ----------------------------------------------------------------------------------------------


def _lora_state(request: web.Request) -> ServerState:
    state = request.app[STATE]
    if not state.lora_enabled:
        raise ApiError(404, "LoRA adapters are not enabled on this server; start it with --enable-lora.")
    return state


@documented(Operation("vLLM's runtime LoRA load (with --enable-lora)", {
    200: Reply("loaded", TEXT), 400: BAD_REQUEST, 404: Reply("LoRA not enabled, or no adapter at the path", ERROR),
    500: INTERNAL}, body=Content(LoadLoraAdapterRequest), tags=("lora",)))  # fmt: skip
async def _load_lora_adapter(request: web.Request) -> web.Response:
    state = _lora_state(request)
    body = _parse(LoadLoraAdapterRequest, await _json_body(request))
    adapter = Adapter(body.lora_name, body.lora_path)
    slots, holder = state.context.slots, state.context.holder
    with state.registry.loading(adapter):
        await state.engine.call(lambda: slots.attach(holder.module, adapter))
    log.info("loaded LoRA adapter %s from %s", adapter.name, adapter.path)
    return web.Response(text=f"Success: LoRA adapter '{adapter.name}' added successfully.")


@documented(Operation("vLLM's runtime LoRA unload (with --enable-lora)", {
    200: Reply("unloaded", TEXT), 400: BAD_REQUEST, 404: Reply("LoRA not enabled, or no such adapter", ERROR),
    500: INTERNAL}, body=Content(UnloadLoraAdapterRequest), tags=("lora",)))  # fmt: skip
async def _unload_lora_adapter(request: web.Request) -> web.Response:
    state = _lora_state(request)
    body = _parse(UnloadLoraAdapterRequest, await _json_body(request))
    slots, holder = state.context.slots, state.context.holder
    with state.registry.unloading(body.lora_name) as adapter:
        await state.engine.call(lambda: slots.detach(holder.module, adapter.name))
    log.info("unloaded LoRA adapter %s", adapter.name)
    return web.Response(text=f"Success: LoRA adapter '{adapter.name}' removed successfully.")


# The application -----------------------------------------------------------------------------------


@web.middleware
async def _observe(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Count and time every request by its route pattern (bounded label values, unlike raw paths)."""
    started = time.perf_counter()
    code = 500
    try:
        response = await handler(request)
        code = response.status
        return response
    except web.HTTPException as error:
        code = error.status
        raise
    finally:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        metrics = request.app[STATE].metrics
        metrics.http_requests.labels(route, request.method, str(code)).inc()
        metrics.http_seconds.labels(route, request.method).observe(time.perf_counter() - started)


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


def create_app(state: ServerState) -> web.Application:
    app = web.Application(middlewares=[_observe, _errors])
    app[STATE] = state
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
    serve_openapi(app, "dualpods transformers runtime", "0.1.0", "vLLM's OpenAI-compatible HTTP surface on "
                  "transformers, for models vLLM cannot run (E4).")  # fmt: skip
    return app
