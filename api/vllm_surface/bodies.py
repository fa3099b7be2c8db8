"""The bodies of vLLM's routes around inference: model cards, dev-mode sleep/wake, runtime LoRA load/unload.

Requests ignore unknown fields, as vLLM does, but take JSON types strictly (a number is not a string), so a
body means what its JSON says and an OpenAPI document built from these models is exactly what is accepted.
"""

import time
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

SLEEP_LEVELS = (0, 1, 2)  # vLLM's: 1 moves the weights to host memory, 2 drops them, 0 frees the KV cache only
WAKE_TAGS = frozenset({"weights", "kv_cache"})  # vLLM's parts of a sleeping engine that wake separately
SleepMode = Literal["abort", "wait"]  # what a sleep does to requests in flight (vLLM's `keep` is not modelled)
SLEEP_MODES: tuple[SleepMode, ...] = ("abort", "wait")
MAX_PATH_CHARS = 4096  # PATH_MAX: a longer LoRA path cannot name a file
MAX_NAME_CHARS = 256


class StrictBody(BaseModel):
    # Strict types: `"n": "2"` or `"top_p": true` is a 400 here (vLLM's lax pydantic would take them).
    model_config = ConfigDict(extra="ignore", strict=True)


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
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


class LoadLoraAdapterRequest(StrictBody):
    lora_name: LoraName = ""
    lora_path: Annotated[str, Field(max_length=MAX_PATH_CHARS), AfterValidator(_no_nul)] = ""


class UnloadLoraAdapterRequest(StrictBody):
    lora_name: LoraName = ""


class SleepQuery(BaseModel):
    level: Literal["0", "1", "2"] = Field(default="1", description="1: weights to CPU; 2: dropped; 0: KV cache only")
    mode: SleepMode = Field(default="abort", description="what happens to requests in flight")


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
