"""What every launcher holds, kept current by its watch stream (E2: no polling), for both controllers.

Each launcher Pod with an address gets a view, fed by the controllers' one list/watch loop
(kube.listwatch): the launcher's instances are listed, then `/v2/vllm/instances/watch?since=N` is
followed. A broken stream resumes from the last revision; the launcher's epoch (E14) decides when that is
not enough and the instances are listed again: a new boot ID in the list or in any event, a 410 answer
to `since` (a launcher that restarted does not hold our revision), a stream silent past its heartbeat,
and a restart of the launcher Pod's container (the caller passes the container's incarnation to
`track`). Each change calls every `on_change(launcher name)` listener, so a controller reacts within
milliseconds of an instance becoming ready, sleeping, waking or stopping; each list that found
something new also calls `on_listed(name, view)`, so instances made while nobody watched get looked at.

What a launcher offers is read from its index once per launcher process (its first list): dualpods'
launcher reports each instance's readiness and sleep state in its states and events (E1). One that speaks
only FMA's API (FMA's launcher, or ours with `--fma-only`) reports neither and sends only CREATED, STOPPED
and DELETED events, so the views learn them from the instances themselves, as FMA's controller does: an
InstanceProber polls each running instance's own `/health` until it answers, then asks vLLM's
`/is_sleeping`; the controller records each sleep and wake it makes through vLLM's endpoints (`learn`).
Either way the view's instance states carry `ready` and `sleeping`, so the reconcilers read one picture.
Such a launcher's watch stream sends no heartbeats, so a quiet one is listed again every
WATCH_SILENCE_TIMEOUT_S (a poll); a change of FMA's notifier annotation on the launcher Pod
(`dual-pods.llm-d.ai/vllm-instance-signature`, passed to `track`) lists it again at once.
"""

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Hashable
from dataclasses import dataclass, field
from typing import Protocol

from api.launcher import AllInstancesState, EventType, InstanceState, InstanceStatus, WatchEvent
from kube.backoff import Backoff
from kube.listwatch import Expired, list_and_watch

log = logging.getLogger(__name__)

ChangeListener = Callable[[str], None]
READINESS_POLL_S = 0.2  # how often a starting instance of a launcher without readiness events is probed


@dataclass(frozen=True)
class Learned:
    """What an instance of a launcher without dualpods' extensions told about itself: it serves, asleep or
    not. It holds for the instance at `revision` (one made again under the same ID has another)."""

    revision: int
    sleeping: bool


@dataclass
class LauncherView:
    """A launcher's instances as last reported; `synced` once a list arrived for this incarnation."""

    pod_ip: str
    instances: dict[str, InstanceState] = field(default_factory=dict)
    revision: int = 0
    boot_id: str | None = None  # the launcher process's epoch (None from a launcher that has none)
    synced: bool = False
    # It serves dualpods' sleep and wake routes and reports readiness and sleep (E1); False: FMA's API only.
    extensions: bool = True
    learned: dict[str, Learned] = field(default_factory=dict)  # by instance ID, where `extensions` is False
    # Instances the controller created whose revision no list or event has covered yet (see `created`).
    pending: dict[str, InstanceState] = field(default_factory=dict)

    def created(self, state: InstanceState) -> None:
        """The launcher answered the controller's creation with `state`. Its CREATED event may arrive after
        the controller's next pass, and a list sent before the creation may land after it: until the view's
        revision reaches the creation's, the view holds the instance, so that a pass does not find the
        instance it just made missing (and delete its requester as lost)."""
        if state.revision <= self.revision:
            return  # the stream already told (or told of a later deletion)
        self.pending[state.instance_id] = state
        self.instances[state.instance_id] = self.known(state)

    def cover_pending(self, listed: bool) -> None:
        """Drop the pending creations the view's revision now covers; after a list, show the others again
        (the list predates them)."""
        self.pending = {k: s for k, s in self.pending.items() if s.revision > self.revision}
        if listed:
            for instance_id, state in self.pending.items():
                self.instances.setdefault(instance_id, self.known(state))

    def known(self, state: InstanceState) -> InstanceState:
        """`state` with what its instance told about itself where the launcher does not report it."""
        learned = self.learned.get(state.instance_id)
        if self.extensions or learned is None or learned.revision != state.revision:
            return state
        if state.status is not InstanceStatus.RUNNING:
            return state
        return state.model_copy(update={"ready": True, "sleeping": learned.sleeping})

    def learn(self, instance_id: str, sleeping: bool) -> bool:
        """Record that the instance serves, asleep or not; False when it is no longer there."""
        state = self.instances.get(instance_id)
        if state is None:
            return False
        self.learned[instance_id] = Learned(state.revision, sleeping)
        self.instances[instance_id] = self.known(state)
        return True

    def unlearned(self) -> list[InstanceState]:
        """Running instances of a launcher without readiness reports that have not been seen serving."""
        if self.extensions or not self.synced:
            return []
        return [s for s in self.instances.values() if s.status is InstanceStatus.RUNNING and not s.ready]


class ListedListener(Protocol):
    def __call__(self, launcher: str, view: LauncherView) -> None: ...


class LauncherStreams(Protocol):
    """The launcher API as the views read it (controller.launcher_client.LauncherClient)."""

    async def offers_extensions(self, pod_ip: str) -> bool: ...

    async def list_instances(self, pod_ip: str, isc_name: str = "") -> AllInstancesState: ...

    def events(self, pod_ip: str, since: int) -> AsyncIterator[WatchEvent]:
        """The watch stream from `since`; Expired when the launcher no longer holds it (or goes silent)."""
        ...


class InstanceProber(Protocol):
    """An instance's own endpoints (controller.instance_probe.InstanceProbe)."""

    async def serving_asleep(self, pod_ip: str, state: InstanceState) -> bool | None:
        """Whether the instance sleeps, once it serves (its /health answers 200); None while it does not."""
        ...


class ViewSource(Protocol):
    """What the reconcilers read and how the controllers steer them (LauncherViews, or a test's fake)."""

    def get(self, launcher: str) -> LauncherView | None: ...

    def track(
        self, launcher: str, pod_ip: str | None, incarnation: Hashable = None, signature: str | None = None
    ) -> None: ...

    def learn(self, launcher: str, instance_id: str, sleeping: bool) -> None:
        """The controller slept or woke an instance of a launcher without dualpods' extensions."""
        ...

    def forget(self, launcher: str) -> None: ...

    def subscribe(self, on_change: ChangeListener, on_listed: ListedListener | None = None) -> None: ...


def _comparable(states: dict[str, InstanceState]) -> dict[str, InstanceState]:
    """The instances without their process statistics, which change at every list."""
    return {k: s.model_copy(update={"process": None}) for k, s in states.items()}


class _LauncherFeed:
    """One launcher's list and watch, for kube.listwatch."""

    def __init__(self, views: "LauncherViews", launcher: str, view: LauncherView) -> None:
        self.name = f"launcher {launcher} at {view.pod_ip}"
        self._views = views
        self.launcher = launcher
        self.view = view
        self.unknown = asyncio.Event()  # set when an instance may need probing

    async def list(self) -> None:
        view = self.view
        client = self._views.client
        fresh = not view.synced
        extensions = await client.offers_extensions(view.pod_ip) if fresh else view.extensions
        listing = await client.list_instances(view.pod_ip)
        if not fresh and listing.boot_id != view.boot_id:
            extensions = await client.offers_extensions(view.pod_ip)  # a new launcher process
        if fresh or extensions != view.extensions:
            log.info("%s serves %s", self.name, "dualpods' API" if extensions else "FMA's API only")
        view.extensions = extensions
        listed = {state.instance_id for state in listing.instances}
        view.learned = {k: v for k, v in view.learned.items() if k in listed}
        instances = {state.instance_id: view.known(state) for state in listing.instances}
        news = (
            not view.synced or listing.boot_id != view.boot_id or _comparable(instances) != _comparable(view.instances)
        )
        if view.synced and listing.boot_id != view.boot_id:
            log.info("%s restarted (boot ID %s, was %s)", self.name, listing.boot_id, view.boot_id)
            view.pending = {}  # revisions restart with the process: what it answered before is gone
        view.instances, view.revision, view.boot_id, view.synced = instances, listing.revision, listing.boot_id, True
        view.cover_pending(listed=True)
        self.unknown.set()
        if news:
            self._views.listed(self.launcher, view)

    async def watch(self) -> None:
        view = self.view
        async for event in self._views.client.events(view.pod_ip, view.revision):
            if event.boot_id != view.boot_id:
                raise Expired(f"a new epoch: boot ID {event.boot_id}, was {view.boot_id}")
            state = event.object
            if event.type is EventType.DELETED:
                view.instances.pop(state.instance_id, None)
                view.learned.pop(state.instance_id, None)
            else:
                view.instances[state.instance_id] = view.known(state)
                self.unknown.set()
            view.revision = max(view.revision, state.revision)
            view.cover_pending(listed=False)
            self._views.changed(self.launcher)


@dataclass
class _Follower:
    feed: _LauncherFeed
    incarnation: Hashable
    backoff: Backoff
    task: "asyncio.Task[None] | None" = None
    signature: str | None = None  # FMA's notifier annotation on the launcher Pod, as last seen


class LauncherViews:
    """The views of every tracked launcher; `run` hosts their feeds until cancelled. Without a `prober`
    nothing is learned from the instances of a launcher without dualpods' extensions."""

    def __init__(self, client: LauncherStreams, prober: InstanceProber | None = None) -> None:
        self.client = client
        self._prober = prober
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

    def track(
        self, launcher: str, pod_ip: str | None, incarnation: Hashable = None, signature: str | None = None
    ) -> None:
        """Follow `launcher` at `pod_ip`; None (no address, not running, or gone) stops following it. A new
        `incarnation` (its container restarted) starts its view afresh; the same one cuts a retry wait short,
        and a changed `signature` (FMA's notifier annotation) lists its instances again."""
        follower = self._followers.get(launcher)
        if follower is not None and follower.feed.view.pod_ip == pod_ip and follower.incarnation == incarnation:
            changed = signature is not None and follower.signature not in (None, signature)
            follower.signature = signature or follower.signature
            if changed and follower.task is not None:
                follower.task.cancel()  # its list and watch start over, on the same view
                follower.task = None
                self._start(follower)
            follower.backoff.nudge()
            return
        self.forget(launcher)
        if pod_ip is None:
            return
        feed = _LauncherFeed(self, launcher, LauncherView(pod_ip=pod_ip))
        follower = _Follower(feed, incarnation, Backoff(), signature=signature)
        self._followers[launcher] = follower
        self._start(follower)

    def learn(self, launcher: str, instance_id: str, sleeping: bool) -> None:
        follower = self._followers.get(launcher)
        if follower is not None and follower.feed.view.learn(instance_id, sleeping):
            self.changed(launcher)

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
            follower.task = self._group.create_task(self._follow(follower))

    async def _follow(self, follower: _Follower) -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(list_and_watch(follower.feed, follower.backoff))
            if self._prober is not None:
                tasks.create_task(self._probe(follower.feed, self._prober))

    async def _probe(self, feed: _LauncherFeed, prober: InstanceProber) -> None:
        """Until each running instance of a launcher without readiness reports was seen serving: poll them."""
        view = feed.view
        while True:
            await feed.unknown.wait()
            pending = view.unlearned()
            if not pending:
                feed.unknown.clear()
                continue
            for state in pending:
                try:
                    self._probe_one(feed, state, await prober.serving_asleep(view.pod_ip, state))
                except Exception as err:  # a server that answers oddly is asked again at the next poll
                    log.debug("%s: instance %s not probed (%s)", feed.name, state.instance_id, err)
            await asyncio.sleep(READINESS_POLL_S)

    def _probe_one(self, feed: _LauncherFeed, state: InstanceState, sleeping: bool | None) -> None:
        """Record a probe's answer, unless something was learned meanwhile (the controller's own sleep or
        wake is newer) or the instance changed."""
        view = feed.view
        current = view.instances.get(state.instance_id)
        if sleeping is None or current is None or current.revision != state.revision or current.ready:
            return
        view.learn(state.instance_id, sleeping)
        log.info("%s: instance %s serves (%s)", feed.name, state.instance_id, "asleep" if sleeping else "awake")
        self.listed(feed.launcher, view)  # as a list that found something new: its ISCs are checked too

    # ----- telling the listeners

    def changed(self, launcher: str) -> None:
        for listener in self._change_listeners:
            listener(launcher)

    def listed(self, launcher: str, view: LauncherView) -> None:
        for on_listed in self._listed_listeners:
            on_listed(launcher, view)
        self.changed(launcher)
