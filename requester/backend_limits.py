"""What the bound model server can hold, learnt from the server itself once it answers.

- `max_model_len`: `GET /v1/models`, the largest over the model cards (vLLM, the transformers runtime
  and the stand-in all report it).
- `kv_cache_tokens`: vLLM's `GET /metrics`, `num_gpu_blocks x block_size` from the labels of
  `vllm:cache_config_info` (the smallest over engines: a request runs on one).
- `max_num_seqs`: vLLM's `GET /server_info?config_format=json` (a dev-mode route; the launcher runs
  vLLM in dev mode for sleep and wake), `scheduler_config.max_num_seqs`.

A limit given in the proxy config wins over a discovered one. A server that answers without a value
(no such metric, a 404) will not grow one later, so its answer is final; an unreachable server or a
5xx is asked again, at most once per `RETRY_S`. The first two limits judge requests, so a request
waits for them, briefly; `max_num_seqs` only feeds the overload rule, and vLLM builds `/server_info`
slowly (it collects its environment, seconds), so it is fetched in the background.
"""

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from api.tasks import Background

from .metrics_text import samples
from .proxy_target import ProxyTarget
from .upstream import Upstream, UpstreamError

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRY_S = 1.0
GUARD_WAIT_S = 2.0  # what a request waits, at most, for the limits that judge it
FETCH_TIMEOUT_S = 5.0
SERVER_INFO_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Limits:
    """The limits that judge a request; None where unknown."""

    max_model_len: int | None = None
    kv_cache_tokens: int | None = None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _digits(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() and int(text) > 0 else None


def max_model_len_of(models: Any) -> int | None:
    """The largest `max_model_len` of a `/v1/models` answer."""
    cards = models.get("data") if isinstance(models, dict) else None
    lengths = [_int(card.get("max_model_len")) for card in cards or [] if isinstance(card, dict)]
    return max((n for n in lengths if n is not None), default=None)


def kv_cache_tokens_of(metrics_text: str) -> int | None:
    """`num_gpu_blocks x block_size` from `vllm:cache_config_info`, the smallest over engines."""
    sizes = []
    for sample in samples(metrics_text, "vllm:cache_config_info"):
        blocks, block_size = _digits(sample.labels.get("num_gpu_blocks")), _digits(sample.labels.get("block_size"))
        if blocks and block_size:
            sizes.append(blocks * block_size)
    return min(sizes, default=None)


def max_num_seqs_of(server_info: Any) -> int | None:
    config = server_info.get("vllm_config") if isinstance(server_info, dict) else None
    scheduler = config.get("scheduler_config") if isinstance(config, dict) else None
    return _int(scheduler.get("max_num_seqs")) if isinstance(scheduler, dict) else None


def _answered(status: int, what: str) -> bool:
    """True for an answer that settles the question (200, or a 4xx: not there); raises for a 5xx."""
    if status >= 500:
        raise UpstreamError(f"{what} answered {status}")
    return status == 200


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


class _Discovery(Generic[T]):
    """A value fetched until the server answers: one fetch at a time, failures retried after RETRY_S."""

    def __init__(self, name: str, fetch: Callable[[], Awaitable[T]], background: Background) -> None:
        self._name = name
        self._fetch = fetch
        self._background = background
        self._task: asyncio.Task[None] | None = None
        self._failed_at = -RETRY_S
        self.done = False
        self.value: T | None = None

    def start(self) -> asyncio.Task[None] | None:
        """The fetch in progress, or a new one when due; None when done or not due."""
        if self.done:
            return None
        if self._task is not None and not self._task.done():
            return self._task
        if time.monotonic() - self._failed_at < RETRY_S:
            return None
        self._task = self._background.start(self._run(), name=f"learn {self._name}")
        return self._task

    async def _run(self) -> None:
        try:
            self.value = await self._fetch()
        except UpstreamError as err:
            self._failed_at = time.monotonic()
            log.warning("cannot learn the model server's limits yet", extra={"what": self._name, "error": str(err)})
            return
        self.done = True
        log.info("learnt the model server's limits", extra={"what": self._name, "value": repr(self.value)})

    async def wait(self, at_most_s: float) -> None:
        """Wait up to `at_most_s` for a fetch in progress (or due); it carries on in the background."""
        task = self.start()
        if task is not None:
            await asyncio.wait({task}, timeout=at_most_s)


class BackendLimits:
    def __init__(self, target: ProxyTarget, upstream: Upstream, background: Background) -> None:
        self._target = target
        self._upstream = upstream
        self._background = background  # runs the fetches
        self._forget()
        target.on_change(self._forget)

    def _forget(self) -> None:
        """Start afresh: a new target is another server, whose limits are learnt anew."""
        self._guard = _Discovery("max_model_len, kv_cache_tokens", self._fetch_guard_limits, self._background)
        self._concurrency = _Discovery("max_num_seqs", self._fetch_max_num_seqs, self._background)

    async def _fetch_guard_limits(self) -> Limits:
        (models_status, models), (metrics_status, metrics) = await asyncio.gather(
            self._upstream.call("GET", "/v1/models", FETCH_TIMEOUT_S),
            self._upstream.call("GET", "/metrics", FETCH_TIMEOUT_S),
        )
        max_model_len = max_model_len_of(_json(models)) if _answered(models_status, "/v1/models") else None
        kv = kv_cache_tokens_of(metrics.decode(errors="replace")) if _answered(metrics_status, "/metrics") else None
        return Limits(max_model_len, kv)

    async def _fetch_max_num_seqs(self) -> int | None:
        status, body = await self._upstream.call("GET", "/server_info?config_format=json", SERVER_INFO_TIMEOUT_S)
        return max_num_seqs_of(_json(body)) if _answered(status, "/server_info") else None

    def prefetch(self) -> None:
        """Start learning every limit not configured (once the server should answer: bound and ready)."""
        target = self._target.target
        assert target is not None, "no target yet"
        if target.max_model_len is None or target.kv_cache_tokens is None:
            self._guard.start()
        if target.max_num_seqs is None:
            self._concurrency.start()

    def current(self) -> Limits:
        """The configured limits, else the discovered ones, as known now."""
        found = self._guard.value or Limits()
        target = self._target.target
        if target is None:
            return found
        return Limits(target.max_model_len or found.max_model_len, target.kv_cache_tokens or found.kv_cache_tokens)

    async def limits(self) -> Limits:
        """`current()`, after waiting briefly for discovery when a limit was not configured."""
        target = self._target.target
        assert target is not None, "no target yet"
        if target.max_model_len is None or target.kv_cache_tokens is None:
            await self._guard.wait(GUARD_WAIT_S)
        return self.current()

    def max_num_seqs(self) -> int | None:
        """The configured or discovered concurrency; None while unknown (a fetch is then started)."""
        target = self._target.target
        assert target is not None, "no target yet"
        if target.max_num_seqs is not None:
            return target.max_num_seqs
        self._concurrency.start()
        return self._concurrency.value
