"""How many tokens the prompts of a request are: exact from the model server's tokenizer where it has one.

vLLM serves `POST /tokenize`: a text prompt, or chat `messages` rendered with the model's chat template.
Servers without it (the transformers runtime, the stand-in: 404) are not asked again, and then only
what is certain counts: token-id prompts exactly, text as unknown (the guard counts an unknown prompt
as 0 tokens, a lower bound, so it never refuses a request for a prompt size it did not measure).
Content parts other than text (images, audio) are never tokenized: the server would fetch them twice.

Tokenizing costs a request to the model server, so each prompt also carries a cheap upper bound, and
the guard tokenizes only when a limit could be broken at that bound. Byte-level BPE, SentencePiece
with byte fallback and character-level tokenizers never make more tokens than the text has UTF-8
bytes; a chat template adds its own text, bounded here by `TEMPLATE_ALLOWANCE_TOKENS`.
"""

import json
import logging
import math
from dataclasses import dataclass
from typing import Any, TypeGuard

from .upstream import Upstream, UpstreamError

log = logging.getLogger(__name__)

TOKENIZE_PATH = "/tokenize"
TOKENIZE_TIMEOUT_S = 5.0
SPECIAL_TOKENS_ALLOWANCE = 16  # BOS/EOS and the like around a plain prompt
TEMPLATE_ALLOWANCE_TOKENS = 512  # what a chat template may add (system preamble, role markers)
# Chat fields that change how vLLM renders the conversation, passed on to /tokenize as they are.
CHAT_RENDERING_FIELDS = (
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "chat_template",
    "chat_template_kwargs",
    "tools",
)


@dataclass(frozen=True)
class Prompt:
    """One prompt of a request. `tokens` is exact when known without asking (token ids); `tokenize` is the
    `/tokenize` body that measures it (None: it cannot be measured); `upper_bound` may be infinite."""

    tokens: int | None
    tokenize: dict[str, Any] | None
    upper_bound: float


def _is_token_ids(value: object) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def completion_prompts(body: dict[str, Any]) -> list[Prompt] | None:
    """The prompts of a `/v1/completions` body (a string, token ids, or a list of either); None if malformed."""
    prompt = body.get("prompt")
    batch = prompt if isinstance(prompt, list) and not _is_token_ids(prompt) else [prompt]
    prompts = []
    for item in batch:
        if _is_token_ids(item):
            prompts.append(Prompt(len(item), None, len(item)))
        elif isinstance(item, str):
            request = {"model": body.get("model"), "prompt": item, "add_special_tokens": True}
            bound = len(item.encode()) + SPECIAL_TOKENS_ALLOWANCE
            prompts.append(Prompt(None, request, bound))
        else:
            return None
    return prompts or None


def chat_prompt(body: dict[str, Any]) -> Prompt | None:
    """The one prompt of a `/v1/chat/completions` body; None if malformed."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        return None
    if not all(_text_only(m.get("content")) for m in messages):
        return Prompt(None, None, math.inf)
    request = {"model": body.get("model"), "messages": messages}
    request.update({name: body[name] for name in CHAT_RENDERING_FIELDS if name in body})
    rendered = json.dumps([messages, body.get("tools")], ensure_ascii=False).encode()
    return Prompt(None, request, len(rendered) + TEMPLATE_ALLOWANCE_TOKENS)


def _text_only(content: object) -> bool:
    if content is None or isinstance(content, str):
        return True
    return isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content)


class PromptCounter:
    def __init__(self, upstream: Upstream) -> None:
        self._upstream = upstream
        self._server_tokenizes = True

    async def count(self, prompt: Prompt) -> int | None:
        """The prompt's tokens, or None when they cannot be known (no tokenizer, an error: the server decides)."""
        if prompt.tokens is not None or prompt.tokenize is None or not self._server_tokenizes:
            return prompt.tokens
        try:
            status, body = await self._upstream.call("POST", TOKENIZE_PATH, TOKENIZE_TIMEOUT_S, prompt.tokenize)
        except UpstreamError as err:
            log.warning("cannot tokenize a prompt", extra={"error": str(err)})
            return None
        if status in (404, 405):
            log.info("the model server has no tokenizer route; prompts count as unknown", extra={"status": status})
            self._server_tokenizes = False
            return None
        try:
            count = json.loads(body)["count"] if status == 200 else None
        except (ValueError, KeyError, TypeError):
            count = None
        return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None
