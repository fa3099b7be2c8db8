"""The controllers' client-side rate limit: a burst goes at once, the rest at QPS, in arrival order."""

import asyncio
import time

import pytest

from kube.ratelimit import TokenBucket


class StillClock:
    """The bucket's clock, standing still until a test moves it (asyncio's own clock is untouched)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_a_burst_passes_at_once_and_the_rest_at_the_rate() -> None:
    # Ten calls at one instant: the bucket's clock stands still. On a busy machine the calls of one gather
    # otherwise arrive milliseconds apart, the bucket refills meanwhile, and each later wait is rightly shorter.
    bucket = TokenBucket(qps=50, burst=5, clock=StillClock())
    started = time.monotonic()
    waits = await asyncio.gather(*(bucket.acquire() for _ in range(10)))
    elapsed = time.monotonic() - started
    assert waits[:5] == [0.0] * 5
    # The five beyond the burst are spread at 50/s: 20 ms apart, in the order they came.
    assert waits[5:] == pytest.approx([0.02, 0.04, 0.06, 0.08, 0.1])
    assert 0.09 <= elapsed < 10  # they do wait that long (the upper bound: waited, not stuck; a loaded loop is late)


async def test_the_bucket_refills_while_idle() -> None:
    clock = StillClock()  # the bucket's time passes only where the test says
    bucket = TokenBucket(qps=100, burst=2, clock=clock)
    await asyncio.gather(bucket.acquire(), bucket.acquire())
    clock.now += 0.05  # 5 tokens' worth, capped at the burst of 2
    assert [await bucket.acquire(), await bucket.acquire()] == [0.0, 0.0]
    assert await bucket.acquire() > 0


async def test_no_limit_without_a_rate() -> None:
    bucket = TokenBucket(qps=0, burst=0)
    assert await asyncio.gather(*(bucket.acquire() for _ in range(1000))) == [0.0] * 1000


def test_a_burst_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        TokenBucket(qps=10, burst=0)
