"""What a runtime supplies behind vLLM's HTTP surface: its engine, seen through these protocols.

The surface (`api.vllm_surface.app`) reads the request, checks what vLLM checks for every runtime (the JSON,
the sleep level and mode, the wake tags, the LoRA bodies) and writes the answer; the engine decides
everything the runtimes differ in: what an inference body may ask for and what it answers, how sleep and
wake move the model, which models and adapters it serves. An engine refuses with `ApiError`, which the
surface turns into vLLM's error body.
"""

from collections.abc import AsyncIterator, Collection
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from api.vllm_surface.bodies import ModelCard, SleepMode

JsonObject = dict[str, Any]
# One server-sent event's data: a pydantic model (sent as its JSON) or a JSON object.
Chunk = BaseModel | JsonObject


class Answer(Protocol):
    """One admitted inference request's answer, delivered whole or streamed (as the request asked)."""

    @property
    def stream(self) -> bool:
        """Whether the client asked for server-sent events."""
        ...

    async def whole(self) -> JsonObject:
        """The whole answer, once generated; `ApiError` when generating failed."""
        ...

    def chunks(self) -> AsyncIterator[Chunk]:
        """The answer as SSE data objects in vLLM's order (without `[DONE]`); an `ApiError` raised on the way
        travels to the client as a last event, the 200 having gone out."""
        ...


class Engine(Protocol):
    """A runtime's model server: inference, sleep and wake, the models it serves and its metrics."""

    @property
    def metrics_registry(self) -> CollectorRegistry:
        """What `/metrics` exports."""
        ...

    @property
    def is_sleeping(self) -> bool: ...

    def models(self) -> list[ModelCard]:
        """`/v1/models`: the served names (and adapters), in the order vLLM lists them."""
        ...

    def answer(self, body: object, chat: bool) -> AbstractAsyncContextManager[Answer]:
        """Check a completion (`chat`: chat completion) request's body and admit it; the answer is valid until the
        context exits, which also ends its generation (the client may have gone)."""
        ...

    async def sleep(self, level: int, mode: SleepMode) -> None:
        """Sleep at `level` (one of `SLEEP_LEVELS`), after aborting or finishing the requests in flight (`mode`)."""
        ...

    async def wake_up(self, tags: Collection[str] | None) -> bool:
        """Wake the parts `tags` names (of `WAKE_TAGS`; None: all); True once nothing sleeps any more."""
        ...


class Adapters(Protocol):
    """vLLM's runtime LoRA adapters (`--enable-lora`); an engine without them serves no LoRA routes."""

    async def load(self, name: str, path: str) -> None: ...

    async def unload(self, name: str) -> None: ...
