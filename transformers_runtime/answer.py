"""One generation request's answer, assembled from the engine's deltas in vLLM's shapes: whole, or chunk by chunk."""

import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from pydantic import BaseModel

from api.openai_errors import ApiError
from api.vllm_surface.completions import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatStreamChoice,
    CompletionChoice,
    CompletionResponse,
    Usage,
    response_id,
)
from api.vllm_surface.engine import JsonObject

from .engine import Done, Failed, GenerationJob
from .generation import Delta, TokenLogprob
from .logprobs import render
from .text import TextCodec


class Assembly:
    """One request's answer, assembled from its deltas: whole, or chunk by chunk."""

    def __init__(self, chat: bool, model: str, prompt_tokens: int, choices: int, codec: TextCodec | None) -> None:
        """`codec` names the tokens of the logprobs; None when the request asked for none."""
        self.chat = chat
        self.codec = codec
        self.model = model
        self.id = response_id(chat)
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


class GeneratedAnswer:
    """An admitted generation job's answer (an `api.vllm_surface.engine.Answer`)."""

    def __init__(self, job: GenerationJob, assembly: Assembly, stream: bool, include_usage: bool) -> None:
        self.job = job
        self.assembly = assembly
        self.stream = stream
        self.include_usage = include_usage

    async def whole(self) -> JsonObject:
        async for event in self.job.events():
            if isinstance(event, Failed):
                raise _failure(event)
            if isinstance(event, Delta):
                self.assembly.add(event)
        return self.assembly.response().model_dump(mode="json")

    async def chunks(self) -> AsyncIterator[BaseModel]:
        if self.assembly.chat:  # vLLM opens every chat choice with the role
            for index in range(self.job.choices):
                yield self.assembly.chunk(Delta(index, ""), role=True)
        async for event in self.job.events():
            if isinstance(event, Failed):
                raise _failure(event)
            if isinstance(event, Done):
                if self.include_usage:
                    yield self.assembly.usage_chunk()
            else:
                self.assembly.add(event)
                if event.text or event.finish_reason:
                    yield self.assembly.chunk(event)


def _failure(event: Failed) -> ApiError:
    return ApiError(500, event.message, err_type="InternalServerError")
