"""What every launcher holds, kept current by its watch stream (E2: no polling).

For each launcher Pod with an address, one task lists the launcher's instances and then follows
`/v2/vllm/instances/watch?since=<revision>`; after a disconnect it resumes from the last revision, and
after a 410 it lists again. Each change calls `on_change(launcher name)`, so the controller reacts
within milliseconds of an instance becoming ready, sleeping, waking or stopping; each full list also
calls `on_listed(view)`, so instances made while the controller was away get looked at.
"""

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from api.launcher import INSTANCES_PATH, EventType, InstanceState, WatchEvent

from .launcher_client import LauncherClient, launcher_url

log = logging.getLogger(__name__)

RETRY_MAX_S = 5.0
STREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=5, sock_read=None)


@dataclass
class LauncherView:
    """A launcher's instances as last reported; `synced` once the first list arrived."""

    pod_ip: str
    instances: dict[str, InstanceState] = field(default_factory=dict)
    revision: int = 0
    synced: bool = False


class GoneError(Exception):
    """The launcher no longer holds the events after our revision: list again."""


class LauncherViews:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        client: LauncherClient,
        on_change: Callable[[str], None],
        on_listed: Callable[[LauncherView], None],
    ) -> None:
        self._session = session
        self._client = client
        self._on_change = on_change
        self._on_listed = on_listed
        self._views: dict[str, LauncherView] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def get(self, launcher: str) -> LauncherView | None:
        return self._views.get(launcher)

    def track(self, launcher: str, pod_ip: str | None) -> None:
        """Follow `launcher` at `pod_ip`; None (no address, or the Pod is gone) stops following it."""
        view = self._views.get(launcher)
        if view is not None and view.pod_ip == pod_ip:
            return
        self.forget(launcher)
        if pod_ip is None:
            return
        view = LauncherView(pod_ip=pod_ip)
        self._views[launcher] = view
        self._tasks[launcher] = asyncio.get_running_loop().create_task(self._follow(launcher, view))

    def forget(self, launcher: str) -> None:
        self._views.pop(launcher, None)
        task = self._tasks.pop(launcher, None)
        if task is not None:
            task.cancel()

    async def close(self) -> None:
        for launcher in list(self._tasks):
            self.forget(launcher)

    async def _follow(self, launcher: str, view: LauncherView) -> None:
        delay = 0.2
        while True:
            try:
                if not view.synced:
                    await self._list(launcher, view)
                await self._watch(launcher, view)
                delay = 0.2
            except asyncio.CancelledError:
                raise
            except GoneError:
                view.synced = False
            except Exception as err:
                log.info(
                    "launcher %s at %s: watch interrupted (%s); retrying in %.1f s", launcher, view.pod_ip, err, delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)

    async def _list(self, launcher: str, view: LauncherView) -> None:
        listing = await self._client.list_instances(view.pod_ip)
        view.instances = {state.instance_id: state for state in listing.instances}
        view.revision = listing.revision
        view.synced = True
        self._on_listed(view)
        self._on_change(launcher)

    async def _watch(self, launcher: str, view: LauncherView) -> None:
        url = f"{launcher_url(view.pod_ip)}{INSTANCES_PATH}/watch?since={view.revision}"
        async with self._session.get(url, headers=self._client.headers, timeout=STREAM_TIMEOUT) as response:
            if response.status == 410:
                raise GoneError()
            if response.status != 200:
                raise RuntimeError(f"watch answered {response.status}: {(await response.text())[:200]}")
            async for line in response.content:
                if not line.strip():
                    continue
                event = WatchEvent.model_validate(json.loads(line))
                state = event.object
                if event.type is EventType.DELETED:
                    view.instances.pop(state.instance_id, None)
                else:
                    view.instances[state.instance_id] = state
                view.revision = max(view.revision, state.revision)
                self._on_change(launcher)
        raise ConnectionError("the launcher ended the watch stream")
