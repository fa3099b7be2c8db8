"""OpenAI request bodies (the subset vLLM's server accepts that this runtime implements); the answers are
the surface's (`api.vllm_surface.completions`), as are the bodies of the routes around inference
(`api.vllm_surface.bodies`).

Requests ignore unknown fields, as vLLM does, but take JSON types strictly (a number is not a string).
Every field of OpenAI's and vLLM's bodies that changes the answer is declared: what this runtime
implements (sampling, penalties, logit bias, stop strings and token ids, logprobs) is validated with
vLLM's ranges; what it lacks (prompt logprobs, echo, beam search, tools, structured output...) is
refused with a 400 naming the field unless it has its neutral value, so a client never gets an
answer that quietly ignored what it asked for.
"""

import math
from typing import Annotated, Any, ClassVar

from pydantic import BeforeValidator, Field

from api.openai_errors import ApiError
from api.vllm_surface.bodies import StrictBody

from .sampling import SamplingParams

# The neutral value of each refused feature: a request may send it, but nothing else.
_NEUTRAL: dict[str, tuple[object, ...]] = {
    "echo": (None, False),
    "suffix": (None, ""),
    "prompt_logprobs": (None,),
    "best_of": (None, 1),
    "use_beam_search": (None, False),
    "min_tokens": (None, 0),
    "skip_special_tokens": (None, True),
    "tools": (None, []),
    "functions": (None, []),
    "tool_choice": (None, "none", "auto"),
    "function_call": (None, "none", "auto"),
    "response_format": (None, {"type": "text"}),
    "structured_outputs": (None,),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
}
PENALTY_LIMIT = 2.0  # OpenAI's and vLLM's range for presence and frequency penalties: [-2, 2]
LOGIT_BIAS_LIMIT = 100.0  # OpenAI's range for a logit bias: [-100, 100]
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
GREEDY_EPSILON = 1e-5  # vLLM's: a temperature below it means greedy decoding
# What torch.Generator.manual_seed takes; a seed beyond it would fail in the model thread.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


class StreamOptions(StrictBody):
    include_usage: bool = False


class _GenerationRequest(StrictBody):
    """What completions and chat completions share: the model, sampling and delivery."""

    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    max_tokens: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    top_k: int | None = Field(default=None, description="vLLM's: -1 or 0 for every token")
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = Field(default=None, description="vLLM's: over the prompt and the output")
    logit_bias: dict[str, float] | None = Field(default=None, description="token id (as a string) to a bias")
    stop_token_ids: list[int] | None = Field(default=None, description="vLLM's: token ids that end a sequence")
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    return_tokens_as_token_ids: bool = Field(default=False, description='vLLM\'s: logprobs name tokens "token_id:N"')
    # Refused unless neutral (see _NEUTRAL).
    prompt_logprobs: Any = None
    use_beam_search: bool | None = None
    min_tokens: int | None = None
    skip_special_tokens: bool | None = None
    structured_outputs: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None

    unsupported: ClassVar[tuple[str, ...]] = (
        "prompt_logprobs",
        "use_beam_search",
        "min_tokens",
        "skip_special_tokens",
        "structured_outputs",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
    )

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def requested_logprobs(self) -> int | None:
        """How many of the most likely tokens to report at each place; None: no logprobs at all."""
        return None

    @staticmethod
    def _logprobs_count(count: int, name: str) -> int:
        if not 0 <= count <= MAX_LOGPROBS:
            raise ApiError(400, f"{name} must be in [0, {MAX_LOGPROBS}], got {count}.", name)
        return count

    def max_new_tokens(self, prompt_tokens: int, max_model_len: int) -> int:
        """vLLM's rule: what was asked for (all the room left if nothing), never beyond the context."""
        room = max_model_len - prompt_tokens
        requested = self.requested_max_tokens()
        return room if requested is None else min(requested, room)

    def sampling(self, default_temperature: float, default_top_p: float, vocab_size: int) -> SamplingParams:
        """Validate the sampling fields with vLLM's messages; 400 on the first bad one."""
        for name in self.unsupported:
            value = getattr(self, name)
            if value not in _NEUTRAL[name]:
                raise ApiError(400, f"{name} is not supported by the transformers runtime.", name)
        temperature = default_temperature if self.temperature is None else self.temperature
        top_p = default_top_p if self.top_p is None else self.top_p
        if not math.isfinite(temperature) or not 0.0 <= temperature <= 2.0:
            raise ApiError(400, f"temperature must be in [0, 2], got {temperature}.", "temperature")
        if not 0.0 < top_p <= 1.0:
            raise ApiError(400, f"top_p must be in (0, 1], got {top_p}.", "top_p")
        if self.n < 1:
            raise ApiError(400, f"n must be at least 1, got {self.n}.", "n")
        greedy = temperature < GREEDY_EPSILON
        if greedy and self.n > 1:
            raise ApiError(400, f"n must be 1 when using greedy sampling, got {self.n}.", "n")
        max_tokens = self.requested_max_tokens()
        if max_tokens is not None and max_tokens < 1:
            raise ApiError(400, f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return SamplingParams(
            n=self.n,
            temperature=0.0 if greedy else temperature,
            top_p=1.0 if greedy else top_p,
            top_k=self._top_k(),
            min_p=self._min_p(),
            seed=self.seed,
            stop=tuple(s for s in stop if s),
            stop_token_ids=frozenset(self._token_ids(self.stop_token_ids or [], vocab_size, "stop_token_ids")),
            ignore_eos=self.ignore_eos,
            include_stop=self.include_stop_str_in_output,
            presence_penalty=self._penalty("presence_penalty"),
            frequency_penalty=self._penalty("frequency_penalty"),
            repetition_penalty=self._repetition_penalty(),
            logit_bias=self._logit_bias(vocab_size),
            logprobs=self.requested_logprobs(),
        )

    def _top_k(self) -> int:
        top_k = -1 if self.top_k is None else self.top_k
        if top_k < -1:
            raise ApiError(400, f"top_k must be -1 (disable), or at least 1, got {top_k}.", "top_k")
        return max(top_k, 0)

    def _min_p(self) -> float:
        min_p = 0.0 if self.min_p is None else self.min_p
        if not 0.0 <= min_p <= 1.0:
            raise ApiError(400, f"min_p must be in [0, 1], got {min_p}.", "min_p")
        return min_p

    def _penalty(self, name: str) -> float:
        value: float | None = getattr(self, name)
        penalty = 0.0 if value is None else value
        if not -PENALTY_LIMIT <= penalty <= PENALTY_LIMIT:
            raise ApiError(400, f"{name} must be in [-2, 2], got {penalty}.", name)
        return penalty

    def _repetition_penalty(self) -> float:
        penalty = 1.0 if self.repetition_penalty is None else self.repetition_penalty
        if not 0.0 < penalty <= 1e6:  # finite: a huge penalty is as good as any, an infinite one makes NaNs
            raise ApiError(400, f"repetition_penalty must be greater than zero, got {penalty}.", "repetition_penalty")
        return penalty

    @staticmethod
    def _token_ids(ids: list[int], vocab_size: int, name: str) -> list[int]:
        for token in ids:
            if not 0 <= token < vocab_size:
                raise ApiError(400, f"{name}: token id {token} is out of vocabulary [0, {vocab_size}).", name)
        return ids

    def _logit_bias(self, vocab_size: int) -> dict[int, float]:
        bias: dict[int, float] = {}
        for key, value in (self.logit_bias or {}).items():
            try:
                token = int(key)
            except ValueError:
                raise ApiError(400, f"logit_bias keys must be token ids, got {key!r}.", "logit_bias") from None
            self._token_ids([token], vocab_size, "logit_bias")
            if not -LOGIT_BIAS_LIMIT <= value <= LOGIT_BIAS_LIMIT:
                raise ApiError(400, f"logit_bias values must be in [-100, 100], got {value}.", "logit_bias")
            bias[token] = value
        return bias

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


def _prompt_list(value: object) -> object:
    """OpenAI's `prompt` is one text, a list of texts, one list of token ids, or a list of those."""
    if isinstance(value, str) or (isinstance(value, list) and value and isinstance(value[0], int)):
        return [value]
    return value


class CompletionRequest(_GenerationRequest):
    prompt: Annotated[list[str | list[int]], BeforeValidator(_prompt_list), Field(min_length=1)]
    max_tokens: int | None = 16  # vLLM's and OpenAI's default for legacy completions
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = Field(default=None, description="report each token's and the N most likely logprobs")
    return_token_ids: bool | None = None  # vLLM's: each choice carries its prompt's and its own token ids

    unsupported = (*_GenerationRequest.unsupported, "echo", "suffix", "best_of")

    def requested_logprobs(self) -> int | None:
        return None if self.logprobs is None else self._logprobs_count(self.logprobs, "logprobs")


class ContentPart(StrictBody):
    type: str
    text: str | None = None


class ChatMessage(StrictBody):
    role: str
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        """The message's text; parts other than text have no meaning to a text-only model."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        for part in self.content:
            if part.type != "text":
                raise ApiError(400, f"content parts of type {part.type!r} are not supported.", "messages")
        return "".join(part.text or "" for part in self.content)


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    tool_choice: Any = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None
    add_generation_prompt: bool = True

    unsupported = (
        *_GenerationRequest.unsupported,
        "tools",
        "functions",
        "tool_choice",
        "function_call",
        "response_format",
    )

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def requested_logprobs(self) -> int | None:
        top = self._logprobs_count(self.top_logprobs or 0, "top_logprobs")
        if top and not self.logprobs:
            raise ApiError(400, "when using top_logprobs, logprobs must be set to true.", "top_logprobs")
        return top if self.logprobs else None

    def conversation(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.text()} for m in self.messages]
