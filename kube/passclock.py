"""The time a reconcile pass spends waiting on the API server and on other servers, told apart from its
own: the reconcile histograms that exclude API calls (`dualpods_reconcile_own_seconds`) read it.

A pass runs inside `timed_pass()`; every call that leaves the process (the Kubernetes client's requests,
rate limiting included; the HTTP calls to launchers, requesters and model servers) runs inside
`waiting()`, which adds its duration to the pass of the task making it. What is left is the pass's own
work, and the moments it was ready to go on but the event loop was running something else: a process
short of CPU shows there, as it should.
"""

import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TypeVar

from prometheus_client import CollectorRegistry, Histogram

K = TypeVar("K")
R = TypeVar("R")


def now() -> float:
    """The module's one clock (tests replace it with one they move)."""
    return time.monotonic()


@dataclass
class PassClock:
    started: float = field(default_factory=lambda: now())
    waited: float = 0.0

    def own_seconds(self) -> float:
        """Since the pass began, less what it waited on calls (never below 0)."""
        return max(0.0, now() - self.started - self.waited)


_CURRENT: ContextVar[PassClock | None] = ContextVar("pass_clock", default=None)


@contextlib.contextmanager
def timed_pass() -> Iterator[PassClock]:
    """The clock of a pass run by the current task (and the tasks it starts)."""
    clock = PassClock()
    token = _CURRENT.set(clock)
    try:
        yield clock
    finally:
        _CURRENT.reset(token)


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    """A call that leaves the process: its time is not the pass's own."""
    started = now()
    try:
        yield
    finally:
        clock = _CURRENT.get()
        if clock is not None:
            clock.waited += now() - started


# A pass's own work is sub-millisecond when all is well; the target is a p99 under 50 ms.
OWN_BUCKETS = (0.0002, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def own_seconds_histogram(registry: CollectorRegistry) -> Histogram:
    return Histogram(
        "dualpods_reconcile_own_seconds",
        "A reconcile pass's own time: its duration less its calls to the API server (rate limiting included) "
        "and to launchers, requesters and model servers; by kind of work item.",
        ["kind"],
        buckets=OWN_BUCKETS,
        registry=registry,
    )


def timed(
    reconcile: Callable[[K], Awaitable[R]], histogram: Histogram, kind: Callable[[K], str]
) -> Callable[[K], Awaitable[R]]:
    """`reconcile`, each pass's own time observed in `histogram` (labelled `kind(key)`)."""

    async def run(key: K) -> R:
        with timed_pass() as clock:
            try:
                return await reconcile(key)
            finally:
                histogram.labels(kind(key)).observe(clock.own_seconds())

    return run
