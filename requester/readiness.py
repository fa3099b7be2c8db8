"""The readiness bit: the dual-pods controller sets it over the SPI, the kubelet reads it at `/ready`.

The proxy holds requests while the bit is clear (the instance is not bound yet, or still waking), so it
can also be awaited.
"""

import asyncio
import logging
import time

from .metrics import RequesterMetrics

log = logging.getLogger(__name__)


class Readiness:
    """Starts unready. The first become-ready is timed from `process_started` (epoch seconds)."""

    def __init__(self, metrics: RequesterMetrics, process_started: float) -> None:
        self._metrics = metrics
        self._process_started = process_started
        self._first_ready_after: float | None = None
        self._became_ready = asyncio.Event()
        metrics.ready.set(0)

    @property
    def ready(self) -> bool:
        return self._became_ready.is_set()

    async def wait(self) -> None:
        """Return once ready (at once if ready now)."""
        await self._became_ready.wait()

    def set(self, ready: bool) -> None:
        log.info("setting ready", extra={"ready": ready, "was_ready": self.ready})
        if ready:
            self._became_ready.set()
        else:
            self._became_ready.clear()
        self._metrics.ready.set(int(ready))
        if ready and self._first_ready_after is None:
            self._first_ready_after = max(time.time() - self._process_started, 0.0)
            self._metrics.first_ready_seconds.observe(self._first_ready_after)
            log.info("first become-ready", extra={"seconds_after_start": round(self._first_ready_after, 3)})
