"""The request guard: refuse, with a 400 that says why, a completion that can never fit the model server.

Two rules, for `/v1/completions` and `/v1/chat/completions` (`docs/api.md` states them in full):

1. context: one prompt's tokens plus the output tokens beyond `max_model_len`;
2. KV cache: `n x Σ over the prompts (prompt tokens + output tokens)` beyond the instance's KV cache:
   the "huge n" request that, accepted, stalls or starves the server (KAITO's out-of-memory report,
   vLLM issue #39734).

Output tokens are `max_completion_tokens` or `max_tokens`; when neither is set, 1 (the server may stop
at the first token). A prompt whose size is unknown counts 0. Both are lower bounds, so the guard
refuses only what cannot fit; what it cannot judge (a malformed body, no known limit) is forwarded for
the server to answer.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .backend_limits import Limits
from .prompt_tokens import Prompt, PromptCounter, chat_prompt, completion_prompts


@dataclass(frozen=True)
class Rejection:
    reason: str  # the metric label: context_length or kv_cache
    code: str  # the OpenAI error code
    param: str
    message: str


@dataclass(frozen=True)
class _Completion:
    """What the rules read from a request body."""

    prompts: list[Prompt]
    prompt_param: str  # prompt or messages
    n: int
    output_param: str  # max_tokens or max_completion_tokens
    max_output: int | None  # None: not set

    @property
    def output(self) -> int:
        return 1 if self.max_output is None else self.max_output


def _int_at_least(value: object, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _parse(body: Any, chat: bool) -> _Completion | None:
    if not isinstance(body, dict):
        return None
    n = 1 if body.get("n") is None else body["n"]
    if not _int_at_least(n, 1):
        return None
    output_param, max_output = "max_tokens", None
    for name in ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",):
        if body.get(name) is not None:
            if not _int_at_least(body[name], 0):
                return None
            output_param, max_output = name, body[name]
            break
    if chat:
        prompt = chat_prompt(body)
        prompts = None if prompt is None else [prompt]
    else:
        prompts = completion_prompts(body)
    if prompts is None:
        return None
    return _Completion(prompts, "messages" if chat else "prompt", n, output_param, max_output)


def _first_broken(request: _Completion, sizes: Sequence[float | None], limits: Limits) -> Rejection | None:
    """The first rule `request` breaks when its prompts are `sizes` tokens (None: unknown, counted 0)."""
    out = request.output
    context = limits.max_model_len
    if context is not None:
        for index, size in enumerate(sizes):
            if (size or 0) + out > context:
                return _context_rejection(request, index, size, context)
    kv = limits.kv_cache_tokens
    if kv is not None:
        claim = request.n * sum((size or 0) + out for size in sizes)
        if claim > kv:
            return _kv_rejection(request, sizes, claim, kv)
    return None


def _context_rejection(request: _Completion, index: int, size: float | None, context: int) -> Rejection:
    whose = "the prompt's" if len(request.prompts) == 1 else f"prompt {index}'s"
    limit = f"this model's context of {context} tokens (max_model_len)"
    if request.max_output is None:
        message, param = f"{whose} {size} tokens leave no room for any output in {limit}", request.prompt_param
    elif size is None:
        message, param = f"{request.output_param}={request.max_output} exceeds {limit}", request.output_param
    else:
        room = f"at most {context - size} output tokens fit" if context > size else "the prompt alone fills it"
        message = f"{request.output_param}={request.max_output} plus {whose} {size} tokens exceed {limit}; {room}"
        param = request.output_param
    return Rejection("context_length", "context_length_exceeded", param, message + ".")


def _kv_rejection(request: _Completion, sizes: Sequence[float | None], claim: float, kv: int) -> Rejection:
    unmeasured = " (some unmeasured, counted as 0)" if None in sizes else ""
    if len(sizes) == 1:
        prompt = f"{sizes[0]} prompt tokens" if sizes[0] is not None else "an unmeasured prompt (counted as 0)"
    else:
        prompt = f"{sum(s or 0 for s in sizes)} prompt tokens over {len(sizes)} prompts{unmeasured}"
    output = f"{request.output} output token{'' if request.output == 1 else 's'}"
    output += " per prompt" if len(sizes) > 1 else ""
    if request.max_output is None:
        output += f" (the least possible: {request.output_param} is not set)"
    return Rejection(
        "kv_cache",
        "kv_cache_capacity_exceeded",
        "n",
        f"this request needs {claim:.0f} tokens of KV cache at once, n={request.n} x ({prompt} + {output}), "
        f"more than the {kv} tokens this instance's KV cache holds; lower n or {request.output_param}.",
    )


async def judge(body: bytes, chat: bool, limits: Limits, counter: PromptCounter) -> Rejection | None:
    """The rule a completion body breaks, or None to forward it.

    Prompts are tokenized (one at a time) only when their upper bounds could break a rule.
    """
    if limits.max_model_len is None and limits.kv_cache_tokens is None:
        return None
    try:
        request = _parse(json.loads(body), chat)
    except (ValueError, RecursionError):  # not JSON, or absurdly nested: the server will say
        return None
    if request is None or _first_broken(request, [p.upper_bound for p in request.prompts], limits) is None:
        return None
    sizes = [await counter.count(prompt) for prompt in request.prompts]
    return _first_broken(request, sizes, limits)
