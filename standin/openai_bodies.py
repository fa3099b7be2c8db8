"""OpenAI-shaped completion and chat bodies, full or as SSE chunks, with canned deterministic text.

The stand-in answers the way vLLM's OpenAI server does — same objects, ids, `finish_reason`,
`usage`, chunk sequence (a role chunk first for chat, `finish_reason` on the last token, an optional
usage chunk) — so clients and proxies can be tested without a model. A "token" is one word of a
fixed text; prompt tokens are the prompt's whitespace-separated words.
"""

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from api.openai_errors import ApiError

WORDS = ("The", "stand-in", "server", "answers", "every", "prompt", "with", "this", "same", "text.")
DEFAULT_MAX_TOKENS = 16


def canned_pieces(count: int) -> list[str]:
    """The first `count` tokens of the canned answer, each with its leading space."""
    return [("" if i == 0 else " ") + WORDS[i % len(WORDS)] for i in range(count)]


def _words(text: object) -> int:
    return len(text.split()) if isinstance(text, str) else 0


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
    """One parsed inference request: what to answer, how many choices, and how to deliver it."""

    chat: bool
    model: str
    choices: int
    max_tokens: int
    prompt_tokens: int
    stream: bool
    include_usage: bool
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    created: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def parse(cls, body: object, chat: bool, served_names: list[str]) -> "Job":
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
        else:
            prompt = body.get("prompt")
            batch = prompt if isinstance(prompt, list) else [prompt]
            if not batch or not all(isinstance(p, str) and p for p in batch):
                raise ApiError(400, "Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
            prompts, prompt_tokens = len(batch), sum(_words(p) for p in batch)
        stream_options = body.get("stream_options") or {}
        return cls(
            chat=chat,
            model=model,
            choices=prompts * _positive_int(body, "n", default=1),
            max_tokens=_positive_int(body, "max_completion_tokens", "max_tokens", default=DEFAULT_MAX_TOKENS),
            prompt_tokens=prompt_tokens,
            stream=bool(body.get("stream")),
            include_usage=bool(isinstance(stream_options, dict) and stream_options.get("include_usage")),
        )

    def _envelope(self, chunk: bool) -> dict[str, Any]:
        if self.chat:
            kind, prefix = ("chat.completion.chunk" if chunk else "chat.completion"), "chatcmpl-"
        else:
            kind, prefix = "text_completion", "cmpl-"
        return {"id": prefix + self.id, "object": kind, "created": self.created, "model": self.model}

    def _usage(self) -> dict[str, int]:
        completion_tokens = self.choices * self.max_tokens
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
        }

    def response(self) -> dict[str, Any]:
        """The whole answer, as a non-streaming request gets it."""
        text = "".join(canned_pieces(self.max_tokens))
        payload: dict[str, Any] = {"message": {"role": "assistant", "content": text}} if self.chat else {"text": text}
        choices = [
            {"index": i, **payload, "logprobs": None, "finish_reason": "length", "stop_reason": None}
            for i in range(self.choices)
        ]
        return {**self._envelope(chunk=False), "choices": choices, "usage": self._usage()}

    def chunks(self) -> Iterator[dict[str, Any]]:
        """The answer as SSE `data:` objects, in vLLM's order (without the final `[DONE]`)."""
        pieces = canned_pieces(self.max_tokens)
        if self.chat:
            for i in range(self.choices):
                yield self._chunk(i, {"delta": {"role": "assistant", "content": ""}}, None)
        for position, piece in enumerate(pieces):
            finish = "length" if position == len(pieces) - 1 else None
            payload = {"delta": {"content": piece}} if self.chat else {"text": piece}
            for i in range(self.choices):
                yield self._chunk(i, payload, finish)
        if self.include_usage:
            yield {**self._envelope(chunk=True), "choices": [], "usage": self._usage()}

    def _chunk(self, index: int, payload: dict[str, Any], finish: str | None) -> dict[str, Any]:
        choice = {"index": index, **payload, "logprobs": None, "finish_reason": finish}
        return {**self._envelope(chunk=True), "choices": [choice]}
