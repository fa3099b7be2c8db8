"""A reconcile pass's own time: its duration less its calls, per pass even when passes interleave."""

import asyncio

from prometheus_client import CollectorRegistry

from controller.passclock import own_seconds_histogram, timed, timed_pass, waiting


async def _call(seconds: float) -> None:
    with waiting():
        await asyncio.sleep(seconds)


async def test_waits_on_calls_are_not_the_pass_own_time() -> None:
    with timed_pass() as clock:
        await _call(0.1)
        await _call(0.1)
    assert clock.waited >= 0.2
    assert clock.own_seconds() < 0.05


async def test_each_pass_counts_only_its_own_calls() -> None:
    async def one(wait: float) -> tuple[float, float]:
        with timed_pass() as clock:
            await _call(wait)
            return clock.waited, clock.own_seconds()

    (slow_waited, slow_own), (fast_waited, _) = await asyncio.gather(one(0.2), one(0.05))
    assert slow_waited >= 0.2 > fast_waited >= 0.05
    assert slow_own < 0.05


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
    assert total < 0.04
