"""Every HTTP call the dual-pods controller makes, timed into fma_http_latency_seconds and logged.

Logging the start of each call with the requester's name keeps FMA's DR-20 rule: every outbound call
can be found in the log with when it began.
"""

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from .metrics import DualPodsMetrics, Purpose

log = logging.getLogger(__name__)

TIMEOUT = aiohttp.ClientTimeout(total=30, connect=5)  # FMA's client timeout


@dataclass
class Reply:
    status: int
    body: Any  # parsed JSON when the answer is JSON, else the text

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class HttpError(Exception):
    def __init__(self, purpose: str, url: str, reply: Reply | None, cause: BaseException | None = None) -> None:
        what = f"{reply.status} {str(reply.body)[:300]}" if reply else repr(cause)
        super().__init__(f"{purpose}: {url}: {what}")
        self.reply = reply


class HttpCaller:
    def __init__(self, session: aiohttp.ClientSession, metrics: DualPodsMetrics, namespace: str) -> None:
        self._session = session
        self._metrics = metrics
        self._namespace = namespace

    async def call(
        self,
        purpose: Purpose,
        method: str,
        url: str,
        *,
        body: Any = None,
        headers: dict[str, str] | None = None,
        isc_name: str = "",
        requester: str = "",
    ) -> Reply:
        """The reply, whatever its status; HttpError only when no reply came."""
        started = time.monotonic()
        log.debug("HTTP call start purpose=%s %s %s requesterName=%s", purpose, method, url, requester)
        status = "0"
        try:
            async with self._session.request(method, url, json=body, headers=headers, timeout=TIMEOUT) as response:
                status = str(response.status)
                text = await response.text()
        except (aiohttp.ClientError, TimeoutError) as err:
            raise HttpError(purpose, url, None, err) from None
        finally:
            elapsed = time.monotonic() - started
            self._metrics.http_latency_seconds.labels(purpose, method, self._namespace, isc_name, status).observe(
                elapsed
            )
            log.debug(
                "HTTP call done purpose=%s status=%s in %.3f s requesterName=%s", purpose, status, elapsed, requester
            )
        try:
            parsed: Any = json.loads(text) if text else None
        except ValueError:
            parsed = text
        return Reply(int(status), parsed)

    async def expect_ok(self, purpose: Purpose, method: str, url: str, **kwargs: Any) -> Any:
        reply = await self.call(purpose, method, url, **kwargs)
        if not reply.ok:
            raise HttpError(purpose, url, reply)
        return reply.body
