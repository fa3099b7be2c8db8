"""What every launcher holds, kept current by its watch stream (E2: no polling), for both controllers.

Each launcher Pod with an address gets a view, fed by the controllers' one list/watch loop
(controller.listwatch): the launcher's instances are listed, then `/v2/vllm/instances/watch?since=N` is
followed. A broken stream resumes from the last revision; the launcher's epoch (E14) decides when that is
not enough and the instances are listed again: a new boot ID in the list or in any event, a 410 answer
to `since` (a launcher that restarted does not hold our revision), a stream silent past its heartbeat,
and a restart of the launcher Pod's container (the caller passes the container's incarnation to
`track`). Each change calls every `on_change(launcher name)` listener, so a controller reacts within
milliseconds of an instance becoming ready, sleeping, waking or stopping; each list that found
something new also calls `on_listed(name, view)`, so instances made while nobody watched get looked at.
"""

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Hashable
from dataclasses import dataclass, field
from typing import Protocol

from api.launcher import AllInstancesState, EventType, InstanceState, WatchEvent
from controller.listwatch import Backoff, Expired, list_and_watch

log = logging.getLogger(__name__)

ChangeListener = Callable[[str], None]


@dataclass
class LauncherView:
    """A launcher's instances as last reported; `synced` once a list arrived for this incarnation."""

    pod_ip: str
    instances: dict[str, InstanceState] = field(default_factory=dict)
    revision: int = 0
    boot_id: str | None = None  # the launcher process's epoch (None from a launcher that has none)
    synced: bool = False


class ListedListener(Protocol):
    def __call__(self, launcher: str, view: LauncherView) -> None: ...


class LauncherStreams(Protocol):
    """The launcher API as the views read it (controller.launcher_client.LauncherClient)."""

    async def list_instances(self, pod_ip: str, isc_name: str = "") -> AllInstancesState: ...

    def events(self, pod_ip: str, since: int) -> AsyncIterator[WatchEvent]:
        """The watch stream from `since`; Expired when the launcher no longer holds it (or goes silent)."""
        ...


class ViewSource(Protocol):
    """What the reconcilers read and how the controllers steer them (LauncherViews, or a test's fake)."""

    def get(self, launcher: str) -> LauncherView | None: ...

    def track(self, launcher: str, pod_ip: str | None, incarnation: Hashable = None) -> None: ...

    def forget(self, launcher: str) -> None: ...

    def subscribe(self, on_change: ChangeListener, on_listed: ListedListener | None = None) -> None: ...


def _comparable(states: dict[str, InstanceState]) -> dict[str, InstanceState]:
    """The instances without their process statistics, which change at every list."""
    return {k: s.model_copy(update={"process": None}) for k, s in states.items()}


class _LauncherFeed:
    """One launcher's list and watch, for controller.listwatch."""

    def __init__(self, views: "LauncherViews", launcher: str, view: LauncherView) -> None:
        self.name = f"launcher {launcher} at {view.pod_ip}"
        self._views = views
        self._launcher = launcher
        self.view = view

    async def list(self) -> None:
        view = self.view
        listing = await self._views.client.list_instances(view.pod_ip)
        instances = {state.instance_id: state for state in listing.instances}
        news = (
            not view.synced or listing.boot_id != view.boot_id or _comparable(instances) != _comparable(view.instances)
        )
        if view.synced and listing.boot_id != view.boot_id:
            log.info("%s restarted (boot ID %s, was %s)", self.name, listing.boot_id, view.boot_id)
        view.instances, view.revision, view.boot_id, view.synced = instances, listing.revision, listing.boot_id, True
        if news:
            self._views.listed(self._launcher, view)

    async def watch(self) -> None:
        view = self.view
        async for event in self._views.client.events(view.pod_ip, view.revision):
            if event.boot_id != view.boot_id:
                raise Expired(f"a new epoch: boot ID {event.boot_id}, was {view.boot_id}")
            state = event.object
            if event.type is EventType.DELETED:
                view.instances.pop(state.instance_id, None)
            else:
                view.instances[state.instance_id] = state
            view.revision = max(view.revision, state.revision)
            self._views.changed(self._launcher)


@dataclass
class _Follower:
    feed: _LauncherFeed
    incarnation: Hashable
    backoff: Backoff
    task: "asyncio.Task[None] | None" = None


class LauncherViews:
    """The views of every tracked launcher; `run` hosts their feeds until cancelled."""

    def __init__(self, client: LauncherStreams) -> None:
        self.client = client
        self._followers: dict[str, _Follower] = {}
        self._change_listeners: list[ChangeListener] = []
        self._listed_listeners: list[ListedListener] = []
        self._group: asyncio.TaskGroup | None = None

    def subscribe(self, on_change: ChangeListener, on_listed: ListedListener | None = None) -> None:
        self._change_listeners.append(on_change)
        if on_listed is not None:
            self._listed_listeners.append(on_listed)

    def get(self, launcher: str) -> LauncherView | None:
        follower = self._followers.get(launcher)
        return follower.feed.view if follower is not None else None

    def track(self, launcher: str, pod_ip: str | None, incarnation: Hashable = None) -> None:
        """Follow `launcher` at `pod_ip`; None (no address, not running, or gone) stops following it. A new
        `incarnation` (its container restarted) starts its view afresh; the same one cuts a retry wait short."""
        follower = self._followers.get(launcher)
        if follower is not None and follower.feed.view.pod_ip == pod_ip and follower.incarnation == incarnation:
            follower.backoff.nudge()
            return
        self.forget(launcher)
        if pod_ip is None:
            return
        follower = _Follower(_LauncherFeed(self, launcher, LauncherView(pod_ip=pod_ip)), incarnation, Backoff())
        self._followers[launcher] = follower
        self._start(follower)

    def forget(self, launcher: str) -> None:
        follower = self._followers.pop(launcher, None)
        if follower is not None and follower.task is not None:
            follower.task.cancel()

    async def run(self) -> None:
        """Host the feeds (those tracked before included) until cancelled."""
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                for follower in self._followers.values():
                    self._start(follower)
                await asyncio.Event().wait()
        finally:
            self._group = None

    def _start(self, follower: _Follower) -> None:
        if self._group is not None and follower.task is None:
            follower.task = self._group.create_task(list_and_watch(follower.feed, follower.backoff))

    # ----- telling the listeners

    def changed(self, launcher: str) -> None:
        for listener in self._change_listeners:
            listener(launcher)

    def listed(self, launcher: str, view: LauncherView) -> None:
        for on_listed in self._listed_listeners:
            on_listed(launcher, view)
        self.changed(launcher)
