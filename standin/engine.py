"""The stand-in's engine behind vLLM's surface: the names it serves, sleep/wake, held requests and vLLM's gauges.

Real vLLM pauses its scheduler while asleep: requests that arrive are neither rejected nor served
until `/wake_up`. The engine reproduces that with a gate that inference requests pass through, and
exports the same gauges (`vllm:num_requests_*`, `vllm:engine_sleep_state`) so tests can watch it.
It can also come back wrong from a wake, on purpose (`corrupt_after_wake`): from that wake on it
answers other tokens, as a model whose weights a sleep/wake cycle corrupted does, while every route
keeps answering 200. Where it has an engine process (`engine_core`, as vLLM's EngineCore), every
inference request makes a round trip through it, and fails once that process is dead.
"""

import asyncio
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from dataclasses import KW_ONLY, dataclass, field

from prometheus_client import CollectorRegistry

from api.vllm_surface.bodies import ModelCard, SleepMode
from api.vllm_surface.gauges import export_engine_gauges
from standin.engine_core import EngineCore
from standin.openai_bodies import Job


def _open_gate() -> asyncio.Event:
    gate = asyncio.Event()
    gate.set()
    return gate


@dataclass(eq=False)
class Engine:
    """Serves canned answers for `served_names`, with configurable sleep, wake and request delays (an
    `api.vllm_surface.engine.Engine`)."""

    served_names: list[str]
    root: str
    max_model_len: int
    _: KW_ONLY
    sleep_delay: float = 0.0
    wake_delay: float = 0.0
    request_delay: float = 0.0
    corrupt_after_wake: int | None = None
    core: EngineCore | None = None
    wakes: int = field(default=0, init=False)
    running: int = field(default=0, init=False)
    waiting: int = field(default=0, init=False)
    _level: int | None = field(default=None, init=False)  # the sleep level, None while awake
    _awake: asyncio.Event = field(default_factory=_open_gate, init=False)  # the gate requests pass through
    _transition: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)  # one sleep or wake at a time
    metrics_registry: CollectorRegistry = field(default_factory=CollectorRegistry, init=False)

    def __post_init__(self) -> None:
        export_engine_gauges(
            self.metrics_registry, self.served_names[0], lambda: self.running, lambda: self.waiting, lambda: self._level
        )

    @property
    def is_sleeping(self) -> bool:
        return self._level is not None

    @property
    def corruption(self) -> int:
        """How far off its answers are: 0 until the `corrupt_after_wake`-th wake, 1 from then on."""
        return int(self.corrupt_after_wake is not None and self.wakes >= self.corrupt_after_wake)

    def models(self) -> list[ModelCard]:
        return [
            ModelCard(id=name, owned_by="vllm", root=self.root, max_model_len=self.max_model_len)
            for name in self.served_names
        ]

    @asynccontextmanager
    async def answer(self, body: object, chat: bool) -> AsyncIterator[Job]:
        """The canned answer to a valid request, once admitted (see `admit`)."""
        job = Job.parse(body, chat, self.served_names, self.corruption)
        async with self.admit():
            yield job

    async def sleep(self, level: int, mode: SleepMode) -> None:
        """Stop admitting requests now; after the sleep delay, report sleeping at `level`.

        Requests already running finish whatever `mode` asks (vLLM's `mode=wait`); the stand-in never aborts them.
        """
        async with self._transition:
            self._awake.clear()
            await asyncio.sleep(self.sleep_delay)
            self._level = level

    async def wake_up(self, tags: Collection[str] | None) -> bool:
        """After the wake delay, report awake and release every held request: vLLM can wake only some parts
        (`tags`); the stand-in always wakes fully."""
        async with self._transition:
            await asyncio.sleep(self.wake_delay)
            if self._level is not None:
                self.wakes += 1
            self._level = None
            self._awake.set()
            return True

    @asynccontextmanager
    async def admit(self) -> AsyncIterator[None]:
        """Hold the caller while asleep (counted as waiting), then run it for the request delay and through
        the engine process, if there is one (ApiError 500 when it is dead)."""
        self.waiting += 1
        try:
            await self._awake.wait()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            await asyncio.sleep(self.request_delay)
            if self.core is not None:
                await self.core.step()
            yield
        finally:
            self.running -= 1
