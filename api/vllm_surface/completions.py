"""vLLM's OpenAI answers to completions and chat completions: whole, as stream chunks, with usage and logprobs.

Every runtime behind the surface (the transformers runtime, the stand-in) answers with these models, so a client
sees one shape whichever runtime serves it. What a request may ask for is the runtime's own
(`transformers_runtime.protocol` for the transformers runtime; the stand-in parses its few fields itself).
"""

import time
import uuid
from typing import Literal

from pydantic import BaseModel, Field

FinishReason = Literal["stop", "length", "abort"]
LOGPROB_FLOOR = -9999.0  # vLLM's stand-in for -inf, which JSON cannot carry


def _created() -> int:
    return int(time.time())


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> "Usage":
        return cls(
            prompt_tokens=prompt_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            completion_tokens=completion_tokens,
        )


class _Envelope(BaseModel):
    id: str
    created: int = Field(default_factory=_created)
    model: str


def _finite(logprob: float) -> float:
    return max(logprob, LOGPROB_FLOOR)


class CompletionLogprobs(BaseModel):
    """The legacy completions' logprobs: one entry per generated token in each list."""

    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)

    def add(self, token: str, logprob: float, top: dict[str, float], offset: int) -> None:
        self.text_offset.append(offset)
        self.token_logprobs.append(_finite(logprob))
        self.tokens.append(token)
        self.top_logprobs.append({text: _finite(value) for text, value in top.items()})


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]

    @classmethod
    def of(cls, token: str, logprob: float) -> "TopLogprob":
        return cls(token=token, logprob=_finite(logprob), bytes=list(token.encode()))


class TokenLogprobs(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprobs] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    token_ids: list[int] | None = None  # with return_token_ids
    prompt_token_ids: list[int] | None = None


class CompletionResponse(_Envelope):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None


class ChatCompletionResponse(_Envelope):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class ChatStreamChoice(BaseModel):
    index: int
    delta: dict[str, str]  # {"role": "assistant", "content": ""} first, then {"content": ...}
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None


class ChatCompletionChunk(_Envelope):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatStreamChoice]
    usage: Usage | None = None


def response_id(chat: bool) -> str:
    """A new answer's id, prefixed as vLLM prefixes it."""
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
