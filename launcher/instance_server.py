"""The launcher as a client of each instance's own server (the forked vLLM, transformers runtime or
stand-in): its /health, its /is_sleeping, the sleeps and wakes the launcher forwards, and the post-wake
probe. The one place the launcher speaks HTTP to an instance.

A forwarded call fails (never hangs) when the server does not answer in `backend_timeout_seconds`, or
sooner, when the instance stops meanwhile (its liveness check kills one that hangs).
"""

import asyncio
import contextlib

import aiohttp

from api.launcher import StopReason

from . import wake_check
from .errors import BackendError, BackendTimeout
from .instance import Instance, InstanceExited
from .wake_check import ProbeAnswer

SLEEP_STATE_TIMEOUT = aiohttp.ClientTimeout(total=2)
READINESS_POLL_SECONDS = 0.02  # a refused connection costs little; the first_healthy phase is no longer than this
CONNECT_TIMEOUT_S = 5.0
REAP_WAIT_S = 1.0  # for the exit code of an instance just killed


class InstanceServers:
    """HTTP to the instances' servers, over one connection pool."""

    def __init__(self, host: str, backend_timeout_seconds: float) -> None:
        # Where the launcher itself reaches an instance bound to `host`.
        self.contact_host = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
        self.backend_timeout_seconds = backend_timeout_seconds
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def base_url(self, instance: Instance) -> str:
        return f"http://{self.contact_host}:{instance.port}"

    async def first_health(self, instance: Instance) -> bool:
        """Poll a new server's /health until it answers (True), or the instance stops (False)."""
        url = f"{self.base_url(instance)}/health"
        while instance.running:
            try:
                async with self.session.get(url, timeout=SLEEP_STATE_TIMEOUT) as response:
                    if response.status == 200:
                        return True
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(READINESS_POLL_SECONDS)
        return False

    async def health(self, instance: Instance, timeout_s: float) -> str | None:
        """One probe of /health: None when it answered 200, else what went wrong."""
        try:
            async with self.session.get(
                f"{self.base_url(instance)}/health", timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as response:
                return None if response.status == 200 else f"it answered {response.status}"
        except TimeoutError:
            return f"no answer within {timeout_s:g} s"
        except aiohttp.ClientError as err:
            return f"{type(err).__name__}: {err}"

    async def is_sleeping(self, instance: Instance) -> bool | None:
        """What vLLM's /is_sleeping says; None when it does not say."""
        try:
            async with self.session.get(
                f"{self.base_url(instance)}/is_sleeping", timeout=SLEEP_STATE_TIMEOUT
            ) as response:
                return bool((await response.json())["is_sleeping"]) if response.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError):
            return None

    async def ask_probe(
        self, instance: Instance, prompt: str | list[int], logprobs: bool, limit: aiohttp.ClientTimeout
    ) -> ProbeAnswer:
        """The post-wake probe's answer (`wake_check.ask`); InstanceExited if the instance stops first."""
        work = wake_check.ask(self.session, self.base_url(instance), prompt, logprobs, limit)
        return await instance.end.while_running(work)

    async def sleep(self, instance: Instance, level: int) -> None:
        await self.call(instance, "POST", f"/sleep?level={level}")

    async def wake(self, instance: Instance) -> None:
        await self.call(instance, "POST", "/wake_up")

    async def call(self, instance: Instance, method: str, path: str) -> None:
        """Forward a call to the instance's server: BackendError if it fails, BackendTimeout if it does not
        answer in time, either when the instance stops first (saying why)."""
        timeout_s = self.backend_timeout_seconds
        try:
            await instance.end.while_running(self._request(instance, method, path, timeout_s))
        except TimeoutError:
            raise BackendTimeout(
                f"instance {instance.id} did not answer {method} {path} within {timeout_s:g} s"
            ) from None
        except (InstanceExited, aiohttp.ClientError) as err:
            if instance.end.stop_asked and instance.running:
                raise BackendError(f"instance {instance.id} is being stopped; {method} {path} was cut short") from None
            if instance.stop_reason is None and instance.running:
                raise BackendError(f"instance {instance.id} did not answer {method} {path}: {err!r}") from None
            # It was judged dead meanwhile (and killed, which may have cut this call first), or it exited.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REAP_WAIT_S):
                    await instance.end.wait_exited()
            error = BackendTimeout if instance.stop_reason is StopReason.UNRESPONSIVE else BackendError
            stopped = f"{instance.stop_reason}, " if instance.stop_reason else ""
            raise error(
                f"instance {instance.id} stopped ({stopped}exit code {instance.exit_code}) before it answered "
                f"{method} {path}"
            ) from None

    async def _request(self, instance: Instance, method: str, path: str, timeout_s: float) -> None:
        timeout = aiohttp.ClientTimeout(total=timeout_s, connect=CONNECT_TIMEOUT_S)
        async with self.session.request(method, f"{self.base_url(instance)}{path}", timeout=timeout) as response:
            if response.status >= 300:
                body = (await response.text())[:500]
                raise BackendError(f"instance {instance.id} answered {method} {path} with {response.status}: {body}")
