"""A rate-limited work queue with per-key serialization, after client-go's workqueue.

A key added while it waits is queued once; a key added while a worker processes it is queued again
when the worker is done, so one key is never processed by two workers at once and no change is lost.
Failed keys come back after an exponential back-off; keys can also be scheduled for later. As in
client-go, how long a key waited (from the add that made it pending to the get that hands it out) can be
observed, for FMA's `fma_dpc_innerqueue_queue_duration_seconds`.
"""

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)

BASE_DELAY_S = 0.005
MAX_DELAY_S = 20.0  # FMA's cap
QUIET_RETRIES = 8


class WorkQueue(Generic[K]):
    def __init__(
        self,
        name: str,
        base_delay: float = BASE_DELAY_S,
        max_delay: float = MAX_DELAY_S,
        observe_wait: Callable[[K, float], None] | None = None,
    ) -> None:
        self.name = name
        self._observe_wait = observe_wait
        self._added_at: dict[K, float] = {}
        self._base_delay = base_delay
        self._max_delay = max_delay
        self._queue: collections.deque[K] = collections.deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._failures: collections.Counter[K] = collections.Counter()
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._nonempty = asyncio.Event()
        self._shutting_down = False

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, key: K) -> None:
        if self._shutting_down or key in self._dirty:
            return
        self._dirty.add(key)
        self._added_at[key] = time.monotonic()
        if key not in self._processing:
            self._queue.append(key)
            self._nonempty.set()

    def add_after(self, key: K, delay: float) -> None:
        """Add `key` after `delay` seconds; an earlier pending schedule for it wins."""
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        existing = self._timers.get(key)
        if existing is not None and existing.when() <= loop.time() + delay:
            return
        if existing is not None:
            existing.cancel()
        self._timers[key] = loop.call_later(delay, self._fire, key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def add_rate_limited(self, key: K) -> float:
        """Retry `key` after its next back-off; returns the delay."""
        delay = min(self._base_delay * 2.0 ** self._failures[key], self._max_delay)
        self._failures[key] += 1
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """The key succeeded: its next failure starts the back-off afresh."""
        self._failures.pop(key, None)

    def retries(self, key: K) -> int:
        return self._failures[key]

    async def get(self) -> K | None:
        """The next key to process, or None once the queue shuts down."""
        while not self._queue and not self._shutting_down:
            # No await between the check and clear(): an add() cannot slip in between.
            self._nonempty.clear()
            await self._nonempty.wait()
        if self._shutting_down:
            return None
        key = self._queue.popleft()
        self._processing.add(key)
        self._dirty.discard(key)
        added_at = self._added_at.pop(key, None)
        if self._observe_wait is not None and added_at is not None:
            self._observe_wait(key, time.monotonic() - added_at)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.append(key)
            self._nonempty.set()

    def shutdown(self) -> None:
        self._shutting_down = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._nonempty.set()


Reconcile = Callable[[K], Awaitable[float | None]]


async def run_workers(queue: WorkQueue[K], reconcile: Reconcile[K], workers: int) -> None:
    """Process keys until the queue shuts down. `reconcile` returns seconds after which to look at
    the key again (or None); an exception requeues it with back-off."""

    async def worker() -> None:
        while (key := await queue.get()) is not None:
            try:
                again = await reconcile(key)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                delay = queue.add_rate_limited(key)
                # Early retries are usually a state in transition (a Pod without an address yet).
                level = logging.WARNING if queue.retries(key) > QUIET_RETRIES else logging.INFO
                log.log(level, "%s: reconciling %s failed (retry %d in %.2f s): %s", queue.name, key,
                        queue.retries(key), delay, err, exc_info=log.isEnabledFor(logging.DEBUG))  # fmt: skip
            else:
                queue.forget(key)
                if again is not None:
                    queue.add_after(key, again)
            finally:
                queue.done(key)

    await asyncio.gather(*(worker() for _ in range(workers)))
