"""The controllers' one list/watch loop (kube/listwatch.py), through its two users: the launcher views
(against a small fake launcher HTTP server, real sockets on 127.0.0.1) and the informer (against a fake
API-server list/watch endpoint). A fake server stands in for the launcher and the API server here because
these tests need to send what they cannot be made to send on demand: an event over 1 MiB, a process
restart between two watches, a stream that goes silent, a list in pages.
"""

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from api.launcher import (
    INSTANCES_PATH,
    SLEEP_ROUTE,
    WAKE_ROUTE,
    AllInstancesState,
    EventType,
    Index,
    InstanceState,
    InstanceStatus,
    WatchEvent,
)
from controller import launcher_client
from controller.http import HttpCaller
from controller.launcher_client import LauncherClient
from controller.launcher_views import LauncherView, LauncherViews
from e2e.waiting import wait_for
from kube.informer import Informer

BIG = 1_200_000  # bytes of one env value: an event well over 1 MiB (aiohttp's own line reader stops at 512 KiB)


def state(instance: str, revision: int, env: dict[str, str] | None = None) -> InstanceState:
    return InstanceState(
        status=InstanceStatus.RUNNING, instance_id=instance, revision=revision, options="--model m", env_vars=env
    )


class FakeLauncher:
    """The launcher's list and watch routes, scripted by the test: `restart()` is a new process (new boot
    ID, revisions from 0); `push()` sends an event to the open watch streams; `quiet` sends no heartbeats."""

    def __init__(self) -> None:
        self.boot_id = str(uuid.uuid4())
        self.revision = 0
        self.instances: dict[str, InstanceState] = {}
        self.lists = 0
        self.watches: list[int] = []  # the `since` of each watch request
        self.hold: asyncio.Event | None = None  # when set, a list's answer waits for it (taken, not yet sent)
        self._streams: list[asyncio.Queue[WatchEvent | None]] = []

    def restart(self) -> None:
        self.boot_id, self.revision, self.instances = str(uuid.uuid4()), 0, {}
        self.end_streams()  # the old process's streams end

    def end_streams(self) -> None:
        for stream in self._streams:
            stream.put_nowait(None)

    def push(self, instance: str, env: dict[str, str] | None = None) -> None:
        self.revision += 1
        self.instances[instance] = state(instance, self.revision, env)
        event = WatchEvent(type=EventType.CREATED, object=self.instances[instance], boot_id=self.boot_id)
        for stream in self._streams:
            stream.put_nowait(event)

    async def index(self, request: web.Request) -> web.Response:
        """dualpods' launcher: its index lists the sleep and wake routes."""
        routes = {
            SLEEP_ROUTE: f"POST {INSTANCES_PATH}/{{id}}/sleep",
            WAKE_ROUTE: f"POST {INSTANCES_PATH}/{{id}}/wake_up",
        }
        return web.json_response(Index(endpoints=routes).model_dump())

    async def list(self, request: web.Request) -> web.Response:
        self.lists += 1
        found = list(self.instances.values())
        body = AllInstancesState(revision=self.revision, boot_id=self.boot_id, total_instances=len(found),
                                 running_instances=len(found), instances=found)  # fmt: skip
        if self.hold is not None:
            await self.hold.wait()
        return web.json_response(body.model_dump(mode="json"))

    async def watch(self, request: web.Request) -> web.StreamResponse:
        since = int(request.query["since"])
        self.watches.append(since)
        if since > self.revision:
            return web.json_response({"detail": "gone", "reason": "RevisionGone"}, status=410)
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b"\n")  # a heartbeat right away
        queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue()
        self._streams.append(queue)
        try:
            while (event := await queue.get()) is not None:
                await response.write(event.model_dump_json().encode() + b"\n")
        finally:
            self._streams.remove(queue)
        return response


@pytest.fixture
async def launcher() -> AsyncIterator[tuple[FakeLauncher, str]]:
    fake = FakeLauncher()
    app = web.Application()
    app.router.add_get("/", fake.index)
    app.router.add_get(INSTANCES_PATH, fake.list)
    app.router.add_get(f"{INSTANCES_PATH}/watch", fake.watch)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield fake, f"127.0.0.1:{port}"
    fake.end_streams()
    await runner.cleanup()


@pytest.fixture
async def views(launcher: tuple[FakeLauncher, str], monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LauncherViews]:
    _, address = launcher
    ip, port = address.split(":")
    monkeypatch.setattr(launcher_client, "launcher_url", lambda pod_ip: f"http://{pod_ip}:{port}")
    async with aiohttp.ClientSession() as session:
        made = LauncherViews(LauncherClient(HttpCaller(session, None, "ns"), None))
        running = asyncio.create_task(made.run())
        made.track("l1", ip, incarnation=0)
        yield made
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def until(check: Callable[[], bool], within: float = 5.0) -> None:
    await wait_for(check, what="the view to catch up", within=within, interval=0.01)


def view_of(views: LauncherViews) -> LauncherView:
    found = views.get("l1")
    assert found is not None
    return found


async def test_an_event_over_one_mebibyte_reaches_the_view(
    launcher: tuple[FakeLauncher, str], views: LauncherViews
) -> None:
    fake, _ = launcher
    await until(lambda: view_of(views).synced and bool(fake.watches))
    fake.push("big", {"X": "x" * BIG})
    await until(lambda: "big" in view_of(views).instances)
    assert len((view_of(views).instances["big"].env_vars or {})["X"]) == BIG
    fake.push("after")  # and the stream goes on
    await until(lambda: "after" in view_of(views).instances)


async def test_a_restarted_launcher_is_listed_again(launcher: tuple[FakeLauncher, str], views: LauncherViews) -> None:
    fake, _ = launcher
    changes: list[str] = []
    views.subscribe(changes.append)
    await until(lambda: view_of(views).synced and bool(fake.watches))
    fake.push("a")
    fake.push("b")
    await until(lambda: set(view_of(views).instances) == {"a", "b"})
    old_boot = view_of(views).boot_id
    fake.restart()  # its instances died with it; the resume at revision 2 is beyond its revision 0
    await until(lambda: view_of(views).boot_id == fake.boot_id)
    assert view_of(views).instances == {}
    assert view_of(views).boot_id != old_boot
    assert fake.lists == 2
    assert 2 in fake.watches  # the resume was tried, and answered 410
    assert changes, "the listeners heard of the new listing"


async def test_an_event_of_another_epoch_makes_the_view_list_again(
    launcher: tuple[FakeLauncher, str], views: LauncherViews
) -> None:
    fake, _ = launcher
    await until(lambda: view_of(views).synced and bool(fake.watches))
    fake.boot_id = str(uuid.uuid4())  # the same stream, suddenly from another process (a proxy in between)
    fake.push("c")
    await until(lambda: fake.lists == 2 and view_of(views).boot_id == fake.boot_id)
    assert "c" in view_of(views).instances


async def test_a_changed_notifier_signature_makes_the_view_list_again(
    launcher: tuple[FakeLauncher, str], views: LauncherViews
) -> None:
    """FMA's notifier annotation on the launcher Pod changed: its instances changed, so they are listed again
    at once (an FMA launcher's quiet stream would otherwise be listed again only after its silence)."""
    fake, address = launcher
    ip = address.split(":")[0]
    views.track("l1", ip, incarnation=0, signature="s1")  # first seen: nothing to do
    await until(lambda: view_of(views).synced and bool(fake.watches))
    assert fake.lists == 1
    fake.instances["quiet"] = state("quiet", 1)  # made without an event reaching the stream
    views.track("l1", ip, incarnation=0, signature="s1")  # the same signature: nothing changed
    await asyncio.sleep(0.2)
    assert fake.lists == 1
    views.track("l1", ip, incarnation=0, signature="s2")
    await until(lambda: "quiet" in view_of(views).instances)
    assert fake.lists == 2


async def test_an_instance_the_controller_created_outlives_a_list_taken_before_it(
    launcher: tuple[FakeLauncher, str], views: LauncherViews
) -> None:
    """A list answered after the controller's creation but taken before it does not make the new instance
    vanish from the view (its requester would be deleted as lost); a list that covers it does."""
    fake, address = launcher
    ip = address.split(":")[0]
    views.track("l1", ip, incarnation=0, signature="s1")
    await until(lambda: view_of(views).synced and bool(fake.watches))
    fake.hold = asyncio.Event()
    views.track("l1", ip, incarnation=0, signature="s2")  # a list again, answered once `hold` is set
    await until(lambda: fake.lists == 2)
    fake.revision += 1  # the creation: the launcher's answer, its event not streamed (the stream restarts)
    fake.instances["new"] = created = state("new", fake.revision)
    view_of(views).created(created)
    assert "new" in view_of(views).instances
    fake.hold.set()
    await until(lambda: len(fake.watches) == 2)  # the list has landed, and the watch resumed from its revision
    assert fake.watches[-1] == 0
    assert view_of(views).instances["new"] == created
    # Deleted before any event told of it: the next list (which covers the creation) drops it.
    del fake.instances["new"]
    fake.revision += 1
    views.track("l1", ip, incarnation=0, signature="s3")
    await until(lambda: fake.lists == 3 and "new" not in view_of(views).instances)
    assert view_of(views).pending == {}


async def test_a_silent_stream_is_taken_for_lost(
    launcher: tuple[FakeLauncher, str], views: LauncherViews, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, _ = launcher
    monkeypatch.setattr(launcher_client, "WATCH_SILENCE_TIMEOUT_S", 0.3)
    await until(lambda: fake.lists >= 1 and bool(fake.watches))
    # The fake sends one heartbeat, then nothing: after the silence the view lists again.
    await until(lambda: fake.lists >= 2, within=5)


async def test_a_restarted_container_starts_the_view_afresh(
    launcher: tuple[FakeLauncher, str], views: LauncherViews
) -> None:
    fake, address = launcher
    await until(lambda: view_of(views).synced)
    views.track("l1", address.split(":")[0], incarnation=1)  # its container restarted
    await until(lambda: fake.lists == 2 and view_of(views).synced)


# ----- the informer


class FakeApiServer:
    """An API server's list (in pages of `page` items, with continue tokens) and watch of ConfigMaps."""

    def __init__(self, objects: int, page: int) -> None:
        self.items = [self.configmap(f"cm-{i:03d}", "v") for i in range(objects)]
        self.page = page
        self.list_calls: list[dict[str, str]] = []
        self.watch_events: list[dict[str, Any]] = []
        self.expire_watch = False

    @staticmethod
    def configmap(name: str, value: str, rv: str = "10") -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}, "data": {"k": value}}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        if query.get("watch") == "true":
            if self.expire_watch:
                self.expire_watch = False
                return web.json_response({"kind": "Status", "code": 410, "message": "too old resource version"},
                                         status=410)  # fmt: skip
            response = web.StreamResponse()
            await response.prepare(request)
            for event in self.watch_events:
                await response.write(json.dumps(event).encode() + b"\n")
            self.watch_events = []
            await asyncio.sleep(0.05)
            return response  # the server ends the watch; the informer resumes it
        self.list_calls.append(query)
        start = int(query.get("continue") or 0)
        chunk = self.items[start : start + int(query.get("limit") or len(self.items))]
        following = start + len(chunk)
        meta = {"resourceVersion": "10", **({"continue": str(following)} if following < len(self.items) else {})}
        return web.json_response({"kind": "ConfigMapList", "apiVersion": "v1", "metadata": meta, "items": chunk})


@pytest.fixture
async def api_server() -> AsyncIterator[tuple[FakeApiServer, Callable[..., Awaitable[aiohttp.ClientResponse]]]]:
    fake = FakeApiServer(objects=1203, page=500)
    app = web.Application(client_max_size=8 * 1024 * 1024)
    app.router.add_get("/configmaps", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/configmaps"
    async with aiohttp.ClientSession() as session:

        async def list_watch(**kwargs: Any) -> aiohttp.ClientResponse:
            names = {"_continue": "continue", "resource_version": "resourceVersion", "timeout_seconds": "timeout"}
            params = {
                names.get(k, k): str(v).lower() if isinstance(v, bool) else str(v)
                for k, v in kwargs.items()
                if v is not None and (not k.startswith("_") or k == "_continue")
            }
            return await session.get(url, params=params)

        yield fake, list_watch
    await runner.cleanup()


async def test_the_informer_lists_in_pages_and_reads_a_huge_watch_event(
    api_server: tuple[FakeApiServer, Callable[..., Awaitable[aiohttp.ClientResponse]]],
) -> None:
    fake, list_watch = api_server
    fake.watch_events = [{"type": "ADDED", "object": fake.configmap("huge", "x" * 1_400_000, rv="11")}]
    informer = Informer("configmaps", list_watch)
    running = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 5)
        assert [c.get("limit") for c in fake.list_calls] == ["500", "500", "500"]
        assert [c.get("continue") for c in fake.list_calls] == [None, "500", "1000"]
        await until(lambda: informer.get("ns/huge") is not None)
        assert len(informer.items()) == 1204
        assert len((informer.get("ns/huge") or {})["data"]["k"]) == 1_400_000
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def test_the_informer_lists_again_when_its_version_is_too_old(
    api_server: tuple[FakeApiServer, Callable[..., Awaitable[aiohttp.ClientResponse]]],
) -> None:
    fake, list_watch = api_server
    fake.expire_watch = True
    informer = Informer("configmaps", list_watch)
    running = asyncio.create_task(informer.run())
    try:
        await until(lambda: len(fake.list_calls) >= 6)  # a full (three-page) list, 410, and a second full list
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def test_the_informer_lists_with_its_label_and_field_selectors(
    api_server: tuple[FakeApiServer, Callable[..., Awaitable[aiohttp.ClientResponse]]],
) -> None:
    """The loopback kubelet's informer keeps the Pods of one Node (`spec.nodeName=...`)."""
    fake, list_watch = api_server
    informer = Informer("configmaps", list_watch, label_selector="app=a", field_selector="spec.nodeName=n1")
    running = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 5)
        selectors = {(c.get("label_selector"), c.get("field_selector")) for c in fake.list_calls}
        assert selectors == {("app=a", "spec.nodeName=n1")}
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
