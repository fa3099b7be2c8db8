"""How long to wait before retrying a call to a server that failed: exponential delays with jitter, from
`BASE_DELAY_S` doubling up to `MAX_DELAY_S`, which whoever learns the server is back can cut short (`nudge`).

The list/watch loop (`kube.listwatch`) retries with it, and the loopback kubelet's Pod workers too.
"""

import asyncio
import random

BASE_DELAY_S = 0.2
MAX_DELAY_S = 5.0


class Backoff:
    """Exponential delays with jitter, cut short by `nudge`."""

    def __init__(self, base: float = BASE_DELAY_S, cap: float = MAX_DELAY_S) -> None:
        self._base, self._cap = base, cap
        self._next = base
        self._woken = asyncio.Event()

    def reset(self) -> None:
        self._next = self._base

    def nudge(self) -> None:
        """Retry now: whoever waits in `wait` stops waiting."""
        self._woken.set()

    async def wait(self) -> float:
        """Sleep the next delay (or until nudged); returns the delay that was due."""
        delay = self._next * random.uniform(0.8, 1.2)
        self._next = min(self._next * 2, self._cap)
        self._woken.clear()
        try:
            async with asyncio.timeout(delay):
                await self._woken.wait()
        except TimeoutError:
            pass
        return delay
