"""Client-side rate limiting of API server calls, as client-go's QPS and burst: a token bucket.

Tokens refill at `qps` per second up to `burst`; a call takes one, or waits until the bucket would hold
one. Waiters reserve their token when they arrive (the bucket goes below zero), so they are served in
the order they came and a burst of calls is spread out at `qps` instead of all waking at once.
"""

import asyncio
import time
from collections.abc import Callable


class TokenBucket:
    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        """`qps` <= 0: no limit. `clock` gives the seconds the refill counts (a test's own clock)."""
        if qps > 0 and burst < 1:
            raise ValueError(f"a burst of {burst} lets no call through; it must be at least 1")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._refilled = clock()

    async def acquire(self) -> float:
        """Take a token, waiting for it if needed; the seconds waited."""
        if self.qps <= 0:
            return 0.0
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._refilled) * self.qps)
        self._refilled = now
        self._tokens -= 1.0
        if self._tokens >= 0:
            return 0.0
        delay = -self._tokens / self.qps
        await asyncio.sleep(delay)
        return delay
