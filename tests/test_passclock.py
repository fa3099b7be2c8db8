"""A reconcile pass's own time: its duration less its calls, per pass even when passes interleave.

The module's clock is replaced by one only the test moves: a call "takes" its seconds at once, and nothing else
takes any time, whatever the machine is doing (the exact figures below would be flaky on a wall clock)."""

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from kube import passclock
from kube.passclock import own_seconds_histogram, timed, timed_pass, waiting


class MovedClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> MovedClock:
    moved = MovedClock()
    monkeypatch.setattr(passclock, "now", moved)
    return moved


async def _call(seconds: float) -> None:
    """A call that takes `seconds` on the test's clock, and lets other tasks run meanwhile."""
    with waiting():
        passclock.now.now += seconds  # type: ignore[attr-defined]
        await asyncio.sleep(0)


async def test_waits_on_calls_are_not_the_pass_own_time() -> None:
    with timed_pass() as clock:
        await _call(0.1)
        await _call(0.1)
    assert clock.waited == pytest.approx(0.2)
    assert clock.own_seconds() == pytest.approx(0.0)


async def test_each_pass_counts_only_its_own_calls() -> None:
    async def one(wait: float) -> tuple[float, float]:
        with timed_pass() as clock:
            await _call(wait)
            return clock.waited, clock.own_seconds()

    (slow_waited, slow_own), (fast_waited, _) = await asyncio.gather(one(0.2), one(0.05))
    assert slow_waited >= 0.2 > fast_waited
    assert fast_waited == pytest.approx(0.05)
    assert slow_own == pytest.approx(0.0), "the other pass's call, made meanwhile, is not this pass's own time"


async def test_a_call_outside_any_pass_is_not_counted() -> None:
    await _call(0.01)  # no clock to charge: nothing fails


async def test_timed_observes_the_own_time_by_kind() -> None:
    registry = CollectorRegistry()
    histogram = own_seconds_histogram(registry)

    async def reconcile(key: str) -> str:
        await _call(0.05)
        return key.upper()

    assert await timed(reconcile, histogram, lambda key: f"kind-{key}")("a") == "A"
    count = registry.get_sample_value("dualpods_reconcile_own_seconds_count", {"kind": "kind-a"})
    total = registry.get_sample_value("dualpods_reconcile_own_seconds_sum", {"kind": "kind-a"})
    assert count == 1
    assert total is not None
    assert total == pytest.approx(0.0)
