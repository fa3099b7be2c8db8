"""OpenAI completion and chat answers, full or as SSE chunks, with canned deterministic text.

The stand-in answers with the surface's models (`api.vllm_surface.completions`), as the transformers runtime
does, and the way vLLM's OpenAI server does — same objects, ids, `finish_reason`, `usage`, chunk sequence (a
role chunk first for chat, `finish_reason` on the last token, an optional usage chunk) — so clients and
proxies can be tested without a model. A "token" is one word of a fixed text; prompt tokens are the prompt's
whitespace-separated words, or the token IDs it is made of. As vLLM, a completion can also carry token IDs
(`return_token_ids`: `prompt_token_ids` and `token_ids`) and log-probabilities (`logprobs: N`, with
`return_tokens_as_token_ids`), which a greedy probe of the model compares (the launcher's post-wake check). A
corrupted engine (`--corrupt-after-wake`) answers other tokens, as a model whose weights came back wrong from a
wake would.
"""

import time
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
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
    CompletionLogprobs,
    CompletionResponse,
    FinishReason,
    Usage,
    response_id,
)

WORDS = ("The", "stand-in", "server", "answers", "every", "prompt", "with", "this", "same", "text.")
DEFAULT_MAX_TOKENS = 16
VOCAB_SIZE = 32000
WORD_TOKEN_IDS = tuple(range(1000, 1000 + len(WORDS)))  # the token ID of each word of the canned text
LOGPROB = -0.25  # of every token it answers; the runner-up is RUNNER_UP_LOGPROB
RUNNER_UP_LOGPROB = -2.5
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs


def canned_pieces(count: int, shift: int = 0) -> list[str]:
    """The first `count` tokens of the canned answer, each with its leading space (`shift`: a corrupted one)."""
    return [("" if i == 0 else " ") + WORDS[(i + shift) % len(WORDS)] for i in range(count)]


def canned_token_ids(count: int, shift: int = 0) -> list[int]:
    return [WORD_TOKEN_IDS[(i + shift) % len(WORDS)] for i in range(count)]


def word_token_id(word: str) -> int:
    return zlib.crc32(word.encode()) % VOCAB_SIZE


def _words(text: object) -> int:
    return len(text.split()) if isinstance(text, str) else 0


def _prompt_token_ids(prompt: str | list[int]) -> list[int]:
    return list(prompt) if isinstance(prompt, list) else [word_token_id(w) for w in prompt.split()]


def _is_token_ids(prompt: object) -> bool:
    return (
        isinstance(prompt, list)
        and bool(prompt)
        and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < VOCAB_SIZE for t in prompt)
    )


def _message_words(message: object) -> int:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        return sum(_words(part.get("text")) for part in content if isinstance(part, dict))
    return _words(content)


def _positive_int(body: dict[str, Any], *names: str, default: int) -> int:
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ApiError(400, f"{name} must be a positive integer, got {value!r}.", name)
        return value
    return default


@dataclass(frozen=True)
class Job:
    """One parsed inference request: what to answer, how many choices, and how to deliver it (an
    `api.vllm_surface.engine.Answer`)."""

    chat: bool
    model: str
    choices: int
    max_tokens: int
    prompt_tokens: int
    stream: bool
    include_usage: bool
    prompt_token_ids: tuple[list[int], ...] = ()  # per prompt, with return_token_ids
    logprobs: int | None = None  # top log-probabilities per token asked for
    token_ids_as_tokens: bool = False  # return_tokens_as_token_ids
    shift: int = 0  # a corrupted engine's
    id: str = ""  # the answer's: `response_id`
    created: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def parse(cls, body: object, chat: bool, served_names: list[str], shift: int = 0) -> "Job":
        """Validate a request body as vLLM would; raise `ApiError` 400/404 where vLLM does."""
        if not isinstance(body, dict):
            raise ApiError(400, "The request body must be a JSON object.", "body")
        model = body.get("model") or served_names[0]
        if model not in served_names:
            aliases = ", ".join(served_names)
            raise ApiError(404, f"The model `{model}` does not exist. Valid aliases: {aliases}.", "model")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise ApiError(400, "messages must be a non-empty list.", "messages")
            prompts, prompt_tokens = 1, sum(_message_words(m) for m in messages)
            token_prompts: list[str | list[int]] = []
        else:
            prompt = body.get("prompt")
            batch = [prompt] if isinstance(prompt, str) or _is_token_ids(prompt) else prompt
            if (
                not isinstance(batch, list)
                or not batch
                or not all((isinstance(p, str) and p) or _is_token_ids(p) for p in batch)
            ):
                raise ApiError(400, "Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
            token_prompts = batch
            prompts, prompt_tokens = len(batch), sum(len(_prompt_token_ids(p)) for p in batch)
        logprobs = None if chat else body.get("logprobs")  # chat's logprobs are not modelled
        if logprobs is not None and (
            not isinstance(logprobs, int) or isinstance(logprobs, bool) or not 0 <= logprobs <= MAX_LOGPROBS
        ):
            raise ApiError(400, f"logprobs must be an integer from 0 to {MAX_LOGPROBS}, got {logprobs!r}.", "logprobs")
        with_ids = body.get("return_token_ids") is True and not chat
        stream_options = body.get("stream_options") or {}
        return cls(
            id=response_id(chat),
            prompt_token_ids=tuple(_prompt_token_ids(p) for p in token_prompts) if with_ids else (),
            logprobs=logprobs,
            token_ids_as_tokens=body.get("return_tokens_as_token_ids") is True,
            shift=shift,
            chat=chat,
            model=model,
            choices=prompts * _positive_int(body, "n", default=1),
            max_tokens=_positive_int(body, "max_completion_tokens", "max_tokens", default=DEFAULT_MAX_TOKENS),
            prompt_tokens=prompt_tokens,
            stream=bool(body.get("stream")),
            include_usage=bool(isinstance(stream_options, dict) and stream_options.get("include_usage")),
        )

    def _usage(self) -> Usage:
        return Usage.of(self.prompt_tokens, self.choices * self.max_tokens)

    def _logprobs(self) -> CompletionLogprobs | None:
        """vLLM's completion `logprobs` object for the canned tokens (the runner-up is the next word)."""
        if self.logprobs is None:
            return None
        pieces = canned_pieces(self.max_tokens, self.shift)
        ids = canned_token_ids(self.max_tokens + 1, self.shift)
        names = [f"token_id:{t}" for t in ids] if self.token_ids_as_tokens else [*pieces, WORDS[0]]
        lists, offset = CompletionLogprobs(), 0
        for i, piece in enumerate(pieces):
            top = {names[i]: LOGPROB, names[i + 1]: RUNNER_UP_LOGPROB}
            lists.add(names[i], LOGPROB, dict(list(top.items())[: self.logprobs]), offset)
            offset += len(piece)
        return lists

    async def whole(self) -> dict[str, Any]:
        """The whole answer, as a non-streaming request gets it."""
        text = "".join(canned_pieces(self.max_tokens, self.shift))
        ends: dict[str, Any] = {"finish_reason": "length", "stop_reason": None}
        answer: CompletionResponse | ChatCompletionResponse
        if self.chat:
            message = AssistantMessage(content=text)
            chat = [ChatChoice(index=i, message=message, **ends) for i in range(self.choices)]
            answer = ChatCompletionResponse(**self._envelope(), choices=chat, usage=self._usage())
        else:
            logprobs = self._logprobs()
            choices = [CompletionChoice(index=i, text=text, logprobs=logprobs, **ends) for i in range(self.choices)]
            for i, choice in enumerate(choices if self.prompt_token_ids else []):
                choice.prompt_token_ids = self.prompt_token_ids[i // (self.choices // len(self.prompt_token_ids))]
                choice.token_ids = canned_token_ids(self.max_tokens, self.shift)
            answer = CompletionResponse(**self._envelope(), choices=choices, usage=self._usage())
        return answer.model_dump(mode="json")

    async def chunks(self) -> AsyncIterator[BaseModel]:
        """The answer as SSE `data:` objects, in vLLM's order (without the final `[DONE]`)."""
        pieces = canned_pieces(self.max_tokens, self.shift)
        if self.chat:
            for i in range(self.choices):
                yield self._chunk(i, "", None, role=True)
        for position, piece in enumerate(pieces):
            finish: FinishReason | None = "length" if position == len(pieces) - 1 else None
            for i in range(self.choices):
                yield self._chunk(i, piece, finish)
        if self.include_usage:
            if self.chat:
                yield ChatCompletionChunk(**self._envelope(), choices=[], usage=self._usage())
            else:
                yield CompletionResponse(**self._envelope(), choices=[], usage=self._usage())

    def _envelope(self) -> dict[str, Any]:
        return {"id": self.id, "created": self.created, "model": self.model}

    def _chunk(self, index: int, piece: str, finish: FinishReason | None, role: bool = False) -> BaseModel:
        if self.chat:
            delta = {"role": "assistant", "content": piece} if role else {"content": piece}
            choice = ChatStreamChoice(index=index, delta=delta, finish_reason=finish)
            return ChatCompletionChunk(**self._envelope(), choices=[choice])
        return CompletionResponse(
            **self._envelope(), choices=[CompletionChoice(index=index, text=piece, finish_reason=finish)]
        )
