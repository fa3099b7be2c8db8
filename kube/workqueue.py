"""A rate-limited work queue with per-key serialization, after client-go's workqueue, and the one contract
between it and every reconciler (controller-runtime's Reconcile -> Result).

A key added while it waits is queued once; a key added while a worker processes it is queued again
when the worker is done, so one key is never processed by two workers at once and no change is lost.
Failed keys come back after an exponential back-off; keys can also be scheduled for later. As in
client-go, how long a key waited (from the add that made it pending to the get that hands it out) can be
observed, for FMA's `fma_dpc_innerqueue_queue_duration_seconds`.

A reconcile pass returns a `Result`, which the workers act on:

- `Done`: nothing more to do; the next change of the object (its watch event) brings the next pass.
- `Wait(after_s, why)`: not yet; look again after `after_s` seconds (None: an event will bring the pass).
- `Problem(errors, retry=True)`: back off: the key comes back after the queue's exponential back-off, and
  `errors` say why (the log's line; the reconciler decides whether its object's status shows them).
- `Problem(errors, retry=False)`: terminal: the reconciler told the user (a status, an Event) and only a
  change to some watched object can settle it, so the key is not queued again until that change's event.

An exception out of a pass is a bug (logged at WARNING with its traceback) or an API call that failed in a way
the pass did not expect (an API server that does not answer, a conflict with a newer version: logged quietly at
first, as a back-off the pass asked for); either is logged with the pass's context and backed off. Every pass
runs inside `pass_context`: each of its log lines, the workers' line about how it ended included, carries a pass
ID and the object the key names.
"""

import asyncio
import collections
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from api.log_format import PASS_FIELD, context_fields, log_context
from kube.client import API_FAILURES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Done:
    pass


@dataclass(frozen=True)
class Wait:
    after_s: float | None
    why: str


@dataclass(frozen=True)
class Problem:
    errors: tuple[str, ...]
    retry: bool = True

    @classmethod
    def of(cls, *errors: str, retry: bool = True) -> "Problem":
        return cls(errors, retry)

    def __str__(self) -> str:
        return "; ".join(self.errors)


Result = Done | Wait | Problem
DONE = Done()


def sooner(a: Done | Wait, b: Done | Wait) -> Done | Wait:
    """The result of a part `a` followed by a part `b`: the sooner of their waits, for the reason of the first
    that waits (Done when neither does)."""
    if not isinstance(a, Wait):
        return b
    if not isinstance(b, Wait) or b.after_s is None:
        return a
    return Wait(b.after_s if a.after_s is None else min(a.after_s, b.after_s), a.why)


_pass_ids = itertools.count(1)


@contextlib.contextmanager
def pass_context(**fields: str) -> Iterator[None]:
    """The log context of one reconcile pass: `fields` name its object; a pass ID is added unless the pass
    already has one (a worker's pass that a reconciler names further keeps the worker's ID)."""
    ids = {} if PASS_FIELD in context_fields() else {PASS_FIELD: str(next(_pass_ids))}
    with log_context(**ids, **fields):
        yield


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


Reconcile = Callable[[K], Awaitable[Result]]


def _key_field(key: Hashable) -> Mapping[str, str]:
    return {"key": str(key)}


async def run_workers(
    queue: WorkQueue[K], reconcile: Reconcile[K], workers: int, fields: Callable[[K], Mapping[str, str]] = _key_field
) -> None:
    """Process keys until the queue shuts down, each pass inside its `pass_context` (`fields`: the key's, e.g.
    the name of the object it is), acting on each pass's Result."""

    async def worker() -> None:
        while (key := await queue.get()) is not None:
            try:
                with pass_context(**fields(key)):
                    await _one_pass(queue, reconcile, key)
            finally:
                queue.done(key)

    await asyncio.gather(*(worker() for _ in range(workers)))


async def _one_pass(queue: WorkQueue[K], reconcile: Reconcile[K], key: K) -> None:
    try:
        result = await reconcile(key)
    except asyncio.CancelledError:
        raise
    except API_FAILURES as err:
        _back_off(queue, key, f"failed: {err}", quiet=True)
        return
    except Exception as err:
        _back_off(queue, key, f"failed unexpectedly: {err!r}", quiet=False)
        return
    match result:
        case Problem(retry=True):
            _back_off(queue, key, f"backing off: {result}", quiet=True)
        case Problem():
            queue.forget(key)
            log.debug("%s: %s: waiting for a change: %s", queue.name, key, result)
        case Wait(after_s=after_s):
            queue.forget(key)
            if after_s is not None:
                queue.add_after(key, after_s)
        case Done():
            queue.forget(key)


def _back_off(queue: WorkQueue[K], key: K, why: str, *, quiet: bool) -> None:
    """Retry `key` after its back-off, and say so: a bug at WARNING with its traceback; a back-off the pass asked
    for, or an API call that failed, at INFO for its first QUIET_RETRIES (usually a state in transition: a Pod
    without an address yet, a write that met a newer version), at WARNING after."""
    delay = queue.add_rate_limited(key)
    retries = queue.retries(key)
    loud = not quiet or retries > QUIET_RETRIES
    log.log(logging.WARNING if loud else logging.INFO, "%s: %s: %s (retry %d in %.2f s)", queue.name, key, why,
            retries, delay, exc_info=not quiet or log.isEnabledFor(logging.DEBUG))  # fmt: skip
