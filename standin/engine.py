"""The stand-in's model state: the names it serves, sleep/wake, held requests and vLLM's gauges.

Real vLLM pauses its scheduler while asleep: requests that arrive are neither rejected nor served
until `/wake_up`. The engine reproduces that with a gate that inference requests pass through, and
exports the same gauges (`vllm:num_requests_*`, `vllm:engine_sleep_state`) so tests can watch it.
It can also come back wrong from a wake, on purpose (`corrupt_after_wake`): from that wake on it
answers other tokens, as a model whose weights a sleep/wake cycle corrupted does, while every route
keeps answering 200.
"""

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from prometheus_client import CollectorRegistry, Gauge

SLEEP_STATES = {"awake": None, "weights_offloaded": 1, "discard_all": 2}


class Engine:
    """Serves canned answers for `served_names`, with configurable sleep, wake and request delays."""

    def __init__(
        self,
        served_names: list[str],
        root: str,
        max_model_len: int,
        *,
        sleep_delay: float = 0.0,
        wake_delay: float = 0.0,
        request_delay: float = 0.0,
        corrupt_after_wake: int | None = None,
    ) -> None:
        self.served_names = served_names
        self.root = root
        self.max_model_len = max_model_len
        self._sleep_delay = sleep_delay
        self._wake_delay = wake_delay
        self._request_delay = request_delay
        self._corrupt_after_wake = corrupt_after_wake
        self.wakes = 0
        self._level: int | None = None  # the sleep level, None while awake
        self._awake = asyncio.Event()
        self._awake.set()
        self._transition = asyncio.Lock()  # one sleep or wake at a time, as in vLLM's engine core
        self.running = 0
        self.waiting = 0
        self.registry = CollectorRegistry()
        self._export_gauges()

    def _export_gauges(self) -> None:
        labels = {"model_name": self.served_names[0], "engine": "0"}
        for name, doc, read in (
            ("vllm:num_requests_running", "Requests being answered.", lambda: self.running),
            ("vllm:num_requests_waiting", "Requests held, e.g. while asleep.", lambda: self.waiting),
        ):
            Gauge(name, doc, list(labels), registry=self.registry).labels(**labels).set_function(read)
        sleep_state = Gauge(
            "vllm:engine_sleep_state",
            "awake = 1 when awake; weights_offloaded = 1 at sleep level 1; discard_all = 1 at level 2.",
            [*labels, "sleep_state"],
            registry=self.registry,
        )
        for state, level in SLEEP_STATES.items():
            sleep_state.labels(**labels, sleep_state=state).set_function(self._at_level(level))

    def _at_level(self, level: int | None) -> Callable[[], float]:
        return lambda: float(self._level == level)

    @property
    def is_sleeping(self) -> bool:
        return self._level is not None

    @property
    def corruption(self) -> int:
        """How far off its answers are: 0 until the `corrupt_after_wake`-th wake, 1 from then on."""
        return int(self._corrupt_after_wake is not None and self.wakes >= self._corrupt_after_wake)

    async def sleep(self, level: int) -> None:
        """Stop admitting requests now; after the sleep delay, report sleeping at `level`.

        Requests already running finish (vLLM's `mode=wait`); the stand-in never aborts them.
        """
        async with self._transition:
            self._awake.clear()
            await asyncio.sleep(self._sleep_delay)
            self._level = level

    async def wake_up(self) -> None:
        """After the wake delay, report awake and release every held request."""
        async with self._transition:
            await asyncio.sleep(self._wake_delay)
            if self._level is not None:
                self.wakes += 1
            self._level = None
            self._awake.set()

    @asynccontextmanager
    async def admit(self) -> AsyncIterator[None]:
        """Hold the caller while asleep (counted as waiting), then run it for the request delay."""
        self.waiting += 1
        try:
            await self._awake.wait()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            await asyncio.sleep(self._request_delay)
            yield
        finally:
            self.running -= 1
