"""The transformers runtime behind vLLM's HTTP surface (`api.vllm_surface`): its engine, adapters and documents.

Every input is checked before anything is queued for the model thread: a bad body, parameter or size is a 400
naming it (an OpenAI error body, as vLLM's), never a 500. `/openapi.json` and `/docs` describe every route,
with this runtime's inference bodies (as vLLM serves them too).
"""

import logging
import time
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import CollectorRegistry

from api import version
from api.openai_errors import ApiError
from api.openapi import Content, Operation, Reply
from api.vllm_surface import app as surface
from api.vllm_surface.bodies import ModelCard, SleepMode
from api.vllm_surface.completions import ChatCompletionResponse, CompletionResponse

from .answer import Assembly, GeneratedAnswer
from .batch import Prompt
from .engine import Engine, GenerationJob, ModelContext
from .lora import Adapter, AdapterRegistry
from .metrics import Metrics
from .model import Checkpoint
from .protocol import ChatCompletionRequest, CompletionRequest
from .text import NoChatTemplate

log = logging.getLogger("transformers_runtime")

GENERATION_REPLIES = {
    400: surface.BAD_REQUEST,
    404: Reply("no such model or adapter", surface.ERROR),
    413: Reply("a body over 1 MiB", surface.ERROR),
    429: Reply("too many requests wait already", surface.ERROR),
    500: surface.INTERNAL,
    503: Reply("asleep past --sleep-wait-timeout, or shutting down", surface.ERROR),
}
DOCUMENTATION = surface.Documentation(
    "dualpods transformers runtime",
    version.release(),
    "vLLM's OpenAI-compatible HTTP surface on transformers, for models vLLM cannot run (E4).",
    completions=Operation(
        "vLLM's legacy completions",
        {
            200: Reply(
                "the completion; with `stream`, server-sent events of partial ones", Content(CompletionResponse)
            ),
            **GENERATION_REPLIES,
        },
        body=Content(CompletionRequest),
        tags=("inference",),
    ),
    chat_completions=Operation(
        "vLLM's chat completions (with the model's chat template)",
        {
            200: Reply("the completion; with `stream`, server-sent events of chunks", Content(ChatCompletionResponse)),
            **GENERATION_REPLIES,
        },
        body=Content(ChatCompletionRequest),
        tags=("inference",),
    ),
)


@dataclass
class ServerState:
    """The runtime as vLLM's surface sees it (an `api.vllm_surface.engine.Engine`)."""

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

    @property
    def metrics_registry(self) -> CollectorRegistry:
        return self.metrics.registry

    @property
    def is_sleeping(self) -> bool:
        return self.engine.is_sleeping

    def models(self) -> list[ModelCard]:
        root = str(self.checkpoint.path)
        cards = [
            ModelCard(id=name, root=root, max_model_len=self.checkpoint.max_model_len) for name in self.served_names
        ]
        return cards + [
            ModelCard(id=a.name, root=a.path, parent=a.base_model_name or self.served_names[0]) for a in self.registry
        ]

    async def sleep(self, level: int, mode: SleepMode) -> None:
        with self.metrics.transition_seconds.labels("sleep", str(level)).time():
            await self.engine.sleep(level, mode)

    async def wake_up(self, tags: Collection[str] | None) -> bool:
        level = self.engine.sleep_level
        with self.metrics.transition_seconds.labels("wake", "awake" if level is None else str(level)).time():
            return await self.engine.wake_up(tags)

    @asynccontextmanager
    async def answer(self, body: object, chat: bool) -> AsyncIterator[GeneratedAnswer]:
        """Check the request, queue it for the model thread, and stop its generation once answered."""
        if chat:
            parsed: CompletionRequest | ChatCompletionRequest = surface.parse_body(ChatCompletionRequest, body)
        else:
            parsed = surface.parse_body(CompletionRequest, body)
        model_name, adapter = self.resolve(parsed.model)
        params = parsed.sampling(*self.sampling_defaults(), self.vocab_size)
        if params.n > self.max_num_seqs:  # vLLM would queue them; here they would all be one batch
            raise ApiError(400, f"n must be at most {self.max_num_seqs} (--max-num-seqs), got {params.n}.", "n")
        prompt_count = len(parsed.prompt) if isinstance(parsed, CompletionRequest) else 1
        sequences = params.n * prompt_count
        if sequences > self.max_num_seqs:
            raise ApiError(
                400,
                f"{prompt_count} prompts x n={params.n} are {sequences} sequences, more than the "
                f"{self.max_num_seqs} this server runs at once (--max-num-seqs).",
                "prompt",
            )
        prompts = [self._budget(parsed, ids) for ids in self._prompt_ids(parsed)]
        job = GenerationJob(prompts, params, adapter)
        await self.engine.submit(job)
        codec = self.context.codec if params.logprobs is not None else None
        assembly = Assembly(chat, model_name, sum(len(p.token_ids) for p in prompts), job.choices, codec)
        assembly.tokens_as_ids = parsed.return_tokens_as_token_ids
        if isinstance(parsed, CompletionRequest) and parsed.return_token_ids:
            assembly.prompt_token_ids = [p.token_ids for p in prompts for _ in range(params.n)]
        try:
            yield GeneratedAnswer(job, assembly, parsed.stream, parsed.include_usage)
        finally:
            job.abort()  # a no-op once finished; stops the model thread when the client went away
            self.metrics.prompt_tokens.inc(assembly.prompt_tokens)
            self.metrics.generation_tokens.inc(assembly.completion_tokens)

    def _prompt_ids(self, request: CompletionRequest | ChatCompletionRequest) -> list[list[int]]:
        codec = self.context.codec
        if isinstance(request, ChatCompletionRequest):
            try:
                return [codec.render_chat(request.conversation(), request.add_generation_prompt)]
            except NoChatTemplate as error:
                raise ApiError(400, str(error), "messages") from None
        prompts = []
        for prompt in request.prompt:
            if isinstance(prompt, str):
                prompts.append(codec.encode(prompt, add_special_tokens=True))
            elif all(0 <= token < self.vocab_size for token in prompt):
                prompts.append(prompt)
            else:
                raise ApiError(400, f"Token ids must be in [0, {self.vocab_size}).", "prompt")
        return prompts

    def _budget(self, request: CompletionRequest | ChatCompletionRequest, ids: list[int]) -> Prompt:
        if not ids:  # vLLM's check; an empty prompt has no position to generate from
            raise ApiError(400, "The decoder prompt cannot be empty", "prompt")
        limit = self.checkpoint.max_model_len
        if len(ids) >= limit:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, your prompt contains {len(ids)} "
                "input tokens, which leaves no room for any output token. Please reduce the length of the input "
                "prompt.",
                "input_tokens",
            )
        return Prompt(ids, request.max_new_tokens(len(ids), limit))


@dataclass
class RuntimeAdapters:
    """vLLM's runtime LoRA load and unload (an `api.vllm_surface.engine.Adapters`): attached on the model thread,
    queued like a request."""

    state: ServerState

    async def load(self, name: str, path: str) -> None:
        adapter = Adapter(name, path)
        state = self.state
        slots, holder = state.context.slots, state.context.holder
        with state.registry.loading(adapter):
            await state.engine.call(lambda: slots.attach(holder.module, adapter))
        log.info("loaded LoRA adapter %s from %s", adapter.name, adapter.path)

    async def unload(self, name: str) -> None:
        state = self.state
        slots, holder = state.context.slots, state.context.holder
        with state.registry.unloading(name) as adapter:
            await state.engine.call(lambda: slots.detach(holder.module, adapter.name))
        log.info("unloaded LoRA adapter %s", adapter.name)


def _observing(metrics: Metrics) -> Middleware:
    """Count and time every request by its route pattern (bounded label values, unlike raw paths)."""

    @web.middleware
    async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
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
            metrics.http_requests.labels(route, request.method, str(code)).inc()
            metrics.http_seconds.labels(route, request.method).observe(time.perf_counter() - started)

    return observe


def create_app(state: ServerState) -> web.Application:
    adapters = RuntimeAdapters(state) if state.lora_enabled else None
    return surface.create_app(state, adapters, middlewares=[_observing(state.metrics)], documentation=DOCUMENTATION)
