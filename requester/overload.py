"""Load shedding: answer 429 rather than queue work the model server cannot start soon (KAITO PR #2205's rule).

A request is shed when `max(waiting, pending - max_num_seqs) > max_num_seqs`, where `waiting` is the
server's `vllm:num_requests_waiting` and `pending` the inference requests this proxy has in flight to
it, the new one included. `waiting` is sampled from the server's `/metrics` at most every
`SAMPLE_INTERVAL_S`, in the background: a request never waits for a scrape, it uses the last sample.
While `max_num_seqs` is unknown nothing is shed.
"""

import asyncio
import logging
import time
from dataclasses import dataclass

from api.tasks import Background

from .backend_limits import BackendLimits
from .metrics_text import samples
from .upstream import Upstream, UpstreamError

log = logging.getLogger(__name__)

SAMPLE_INTERVAL_S = 0.15
SAMPLE_TIMEOUT_S = 1.0


def waiting_of(metrics_text: str) -> float:
    """The sum of `vllm:num_requests_waiting` over engines (0 when absent)."""
    return sum(sample.value for sample in samples(metrics_text, "vllm:num_requests_waiting"))


@dataclass(frozen=True)
class Shed:
    waiting: float
    pending: int
    max_num_seqs: int

    @property
    def message(self) -> str:
        return (
            f"the model server is overloaded: {self.waiting:.0f} requests waiting in it and {self.pending} in "
            f"flight to it through this proxy, for {self.max_num_seqs} it runs at once (max_num_seqs); retry later."
        )


class Overload:
    def __init__(self, upstream: Upstream, limits: BackendLimits, background: Background) -> None:
        self._upstream = upstream
        self._limits = limits
        self._background = background  # runs the samples
        self.in_flight = 0
        self._waiting = 0.0
        self._sampled_at = -SAMPLE_INTERVAL_S
        self._sampling: asyncio.Task[None] | None = None

    def admit(self) -> Shed | None:
        """Count the request in (the caller must `release()` it), or say why it is shed."""
        max_num_seqs = self._limits.max_num_seqs()
        if max_num_seqs is not None:
            self._sample_when_due()
            pending = self.in_flight + 1
            if max(self._waiting, pending - max_num_seqs) > max_num_seqs:
                return Shed(self._waiting, pending, max_num_seqs)
        self.in_flight += 1
        return None

    def release(self) -> None:
        self.in_flight -= 1

    def _sample_when_due(self) -> None:
        due = time.monotonic() - self._sampled_at >= SAMPLE_INTERVAL_S
        if due and (self._sampling is None or self._sampling.done()):
            self._sampled_at = time.monotonic()
            self._sampling = self._background.start(self._sample(), name="sample the queue")

    async def _sample(self) -> None:
        try:
            status, body = await self._upstream.call("GET", "/metrics", SAMPLE_TIMEOUT_S)
        except UpstreamError as err:
            log.debug("cannot sample the model server's queue", extra={"error": str(err)})
            return
        if status == 200:
            self._waiting = waiting_of(body.decode(errors="replace"))
