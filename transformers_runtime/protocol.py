"""OpenAI request and response bodies (the subset vLLM's server accepts that this runtime implements).

Requests ignore unknown fields, as vLLM does, but take JSON types strictly (a number is not a string);
features vLLM has and this runtime lacks (logprobs, penalties, tools, structured output...) are
refused with a 400 rather than silently dropped, so a client never gets an answer that quietly
ignored what it asked for.
"""

import math
import time
import uuid
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from api.openai_errors import ApiError

from .generation import FinishReason, SamplingParams

# The neutral value of each refused feature: a request may send it, but nothing else.
_NEUTRAL: dict[str, tuple[object, ...]] = {
    "echo": (None, False),
    "suffix": (None, ""),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "best_of": (None, 1),
    "tools": (None, []),
    "response_format": (None, {"type": "text"}),
}
GREEDY_EPSILON = 1e-5  # vLLM's: a temperature below it means greedy decoding
# What torch.Generator.manual_seed takes; a seed beyond it would fail in the model thread.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
MAX_PATH_CHARS = 4096  # PATH_MAX: a longer LoRA path cannot name a file
MAX_NAME_CHARS = 256


class _Body(BaseModel):
    # Strict types: `"n": "2"` or `"top_p": true` is a 400 here (vLLM's lax pydantic would take them), so a
    # body means what its JSON says, and the OpenAPI document is exactly what is accepted.
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_Body):
    include_usage: bool = False


class _GenerationRequest(_Body):
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
    logprobs: Any = None
    logit_bias: dict[str, float] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    unsupported: ClassVar[tuple[str, ...]] = ("logprobs", "logit_bias", "presence_penalty", "frequency_penalty")

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def max_new_tokens(self, prompt_tokens: int, max_model_len: int) -> int:
        """vLLM's rule: what was asked for (all the room left if nothing), never beyond the context."""
        room = max_model_len - prompt_tokens
        requested = self.requested_max_tokens()
        return room if requested is None else min(requested, room)

    def sampling(self, default_temperature: float, default_top_p: float) -> SamplingParams:
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
            seed=self.seed,
            stop=tuple(s for s in stop if s),
        )

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
    return_token_ids: bool | None = None  # vLLM's: each choice carries its prompt's and its own token ids

    unsupported = (*_GenerationRequest.unsupported, "echo", "suffix", "best_of")


class ContentPart(_Body):
    type: str
    text: str | None = None


class ChatMessage(_Body):
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
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None
    add_generation_prompt: bool = True

    unsupported = (*_GenerationRequest.unsupported, "top_logprobs", "tools", "response_format")

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def conversation(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.text()} for m in self.messages]


# Responses ---------------------------------------------------------------------------------------


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


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: FinishReason | None = None
    stop_reason: str | None = None
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
    logprobs: None = None
    finish_reason: FinishReason | None = None
    stop_reason: str | None = None


class ChatCompletionResponse(_Envelope):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class ChatStreamChoice(BaseModel):
    index: int
    delta: dict[str, str]  # {"role": "assistant", "content": ""} first, then {"content": ...}
    logprobs: None = None
    finish_reason: FinishReason | None = None
    stop_reason: str | None = None


class ChatCompletionChunk(_Envelope):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatStreamChoice]
    usage: Usage | None = None


def completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"


def chat_completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_created)
    owned_by: str = "dualpods"
    root: str
    parent: str | None = None
    max_model_len: int | None = None
    permission: list[Any] = Field(default_factory=list)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


LoraName = Annotated[str, Field(max_length=MAX_NAME_CHARS), AfterValidator(_no_nul)]


class LoadLoraAdapterRequest(_Body):
    lora_name: LoraName = ""
    lora_path: Annotated[str, Field(max_length=MAX_PATH_CHARS), AfterValidator(_no_nul)] = ""


class UnloadLoraAdapterRequest(_Body):
    lora_name: LoraName = ""


# Sleep and wake (vLLM's dev-mode routes) --------------------------------------------------------


class SleepQuery(BaseModel):
    level: Literal["0", "1", "2"] = Field(default="1", description="1: weights to CPU; 2: dropped; 0: KV cache only")
    mode: Literal["abort", "wait"] = Field(default="abort", description="what happens to requests in flight")


class WakeQuery(BaseModel):
    tags: list[Literal["weights", "kv_cache"]] | None = Field(default=None, description="what to wake (default: all)")


class SleepReply(BaseModel):
    status: Literal["sleeping"] = "sleeping"
    level: int


class WakeReply(BaseModel):
    status: Literal["awake", "sleeping"]
    tags: list[str] | None


class IsSleepingReply(BaseModel):
    is_sleeping: bool
