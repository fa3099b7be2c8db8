"""Every HTTP call the controllers make to launchers, requesters and model servers: each one bounded in
time, timed into fma_http_latency_seconds (the dual-pods controller's metric) and logged.

Logging the start of each call with the requester's name keeps FMA's DR-20 rule: every outbound call
can be found in the log with when it began. Each purpose has its own time limit (`TIMEOUTS_S`): a call
to a hung server fails within it, so no reconcile, unbind or deletion waits on that server for longer.
"""

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import aiohttp
from prometheus_client import Histogram

from kube.passclock import waiting

log = logging.getLogger(__name__)


class Purpose(StrEnum):
    """The `purpose` label of fma_http_latency_seconds: FMA's names (pkg/controller/dual-pods, 0.6) for the calls
    FMA makes, our own for our extensions' calls."""

    RELAY_READY = "relay_ready"
    RELAY_UNREADY = "relay_unready"
    GET_GPU_UUIDS = "get_gpu_uuids"
    GET_ACCEL_MEMORY_USAGE = "get_accel_memory_usage"
    QUERY_SLEEPING = "query_sleeping"
    SLEEP = "sleep"
    WAKE = "wake"
    LIST_INSTANCES = "list_instances"
    CREATE_INSTANCE = "create_instance"
    DELETE_INSTANCE = "delete_instance"
    # FMA's launcher client names these too; our controller follows watch streams instead of making these calls
    # (FMA itself only ever makes the first), so they appear only from a controller that does.
    GET_INSTANCE_STATE = "get_instance_state"
    LIST_INSTANCE_IDS = "list_instance_ids"
    DELETE_ALL_INSTANCES = "delete_all_instances"
    GET_HEALTH = "get_health"
    # Ours.
    GET_INDEX = "get_index"  # which routes a launcher serves, once per launcher process
    GET_INSTANCE_HEALTH = "get_instance_health"  # an FMA launcher's instance, polled until it serves
    LIST_MODELS = "list_models"
    LOAD_LORA_ADAPTER = "load_lora_adapter"
    UNLOAD_LORA_ADAPTER = "unload_lora_adapter"
    CONFIGURE_PROXY = "configure_proxy"


CONNECT_TIMEOUT_S = 5.0
DEFAULT_TIMEOUT_S = 30.0  # FMA's client timeout
# Seconds each kind of call may take in all; a requester answers its SPI at once. A sleep or wake moves a
# model's weights (a large one takes tens of seconds), and our launcher lets a forwarded one take up to
# 120 s, failing it within seconds when its liveness check finds the instance hung; a sleep that fails or
# takes longer than this is taken for a hung instance, and the unbind deletes it instead.
TIMEOUTS_S: dict[str, float] = {
    Purpose.SLEEP: 130.0,
    Purpose.WAKE: 130.0,
    Purpose.DELETE_INSTANCE: 20.0,
    Purpose.GET_GPU_UUIDS: 5.0,
    Purpose.GET_ACCEL_MEMORY_USAGE: 5.0,
    Purpose.CONFIGURE_PROXY: 5.0,
    Purpose.RELAY_READY: 5.0,
    Purpose.RELAY_UNREADY: 5.0,
    Purpose.QUERY_SLEEPING: 10.0,
    Purpose.GET_INDEX: 10.0,
    Purpose.GET_INSTANCE_HEALTH: 5.0,
    Purpose.LIST_MODELS: 10.0,
}
# Calls in flight at once (each worker makes one at a time, so this is rarely the limit).
CALL_CONNECTIONS = 100
# A watch stream has no overall limit: its reader times out a silent stream instead.
STREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S, sock_connect=CONNECT_TIMEOUT_S)


@dataclass
class Reply:
    status: int
    body: Any  # parsed JSON when the answer is JSON, else the text

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def reason(self) -> str | None:
        """The machine-readable `reason` of an error body (our launcher's ErrorReason), if any."""
        found = self.body.get("reason") if isinstance(self.body, dict) else None
        return str(found) if found is not None else None


class HttpError(Exception):
    def __init__(self, purpose: str, url: str, reply: Reply | None, cause: BaseException | None = None) -> None:
        what = f"{reply.status} {str(reply.body)[:300]}" if reply else (repr(cause) if cause else "no reply")
        super().__init__(f"{purpose}: {url}: {what}")
        self.reply = reply
        self.timed_out = isinstance(cause, TimeoutError)


def timeout_for(purpose: str) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=TIMEOUTS_S.get(purpose, DEFAULT_TIMEOUT_S), connect=CONNECT_TIMEOUT_S)


class HttpCaller:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        latency: Histogram | None,
        namespace: str,
        streams: aiohttp.ClientSession | None = None,
    ) -> None:
        """`streams`: the session of watch streams (default: `session`'s, see `http_caller`)."""
        self._session = session
        self._streams = streams or session
        self._latency = latency
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
        """The reply, whatever its status; HttpError only when no reply came (in time)."""
        started = time.monotonic()
        log.debug("HTTP call start purpose=%s %s %s requesterName=%s", purpose, method, url, requester)
        status = "0"
        try:
            with waiting():
                async with self._session.request(
                    method, url, json=body, headers=headers, timeout=timeout_for(purpose)
                ) as response:
                    status = str(response.status)
                    text = await response.text()
        except (aiohttp.ClientError, TimeoutError) as err:
            raise HttpError(purpose, url, None, err) from None
        finally:
            elapsed = time.monotonic() - started
            if self._latency is not None:
                self._latency.labels(purpose, method, self._namespace, isc_name, status).observe(elapsed)
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

    @contextlib.asynccontextmanager
    async def stream(
        self, purpose: str, url: str, headers: dict[str, str] | None
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A GET whose body is read as it comes (a watch stream)."""
        log.debug("HTTP stream start purpose=%s GET %s", purpose, url)
        async with self._streams.get(url, headers=headers, timeout=STREAM_TIMEOUT) as response:
            yield response


@contextlib.asynccontextmanager
async def http_caller(latency: Histogram | None, namespace: str) -> AsyncIterator[HttpCaller]:
    """Calls and watch streams, each on connections of their own. A stream per launcher holds its connection
    for as long as the launcher lives: streams get a pool without a limit, and calls one of `CALL_CONNECTIONS`
    that streams never fill (in one pool of aiohttp's default 100, a hundred launchers' streams left no
    connection for any call)."""
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CALL_CONNECTIONS)) as calls,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as streams,
    ):
        yield HttpCaller(calls, latency, namespace, streams)
