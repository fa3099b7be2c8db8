"""The controllers' launcher views against a real launcher (a subprocess on 127.0.0.1 with stand-in model
servers), in both of its faces: dualpods' API, whose instances report readiness and sleep themselves, and the
FMA-only mode (`--fma-only`), the test double for FMA's own launcher, whose index lacks the sleep and wake
routes and whose events say neither. There the views learn readiness from each instance's /health and its
sleep state from vLLM's /is_sleeping, and record the sleeps and wakes the controller makes through vLLM's
own endpoints on the instance's port (issue 13.1).
"""

import asyncio
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from api.keys import INSTANCE_INFERENCE_PORT
from api.launcher import INSTANCES_PATH, SLEEP_ROUTE, WAKE_ROUTE, InstanceState
from controller import launcher_client
from controller.dualpods.provider_client import ProviderClient
from controller.http import HttpCaller
from controller.instance_probe import InstanceProbe
from controller.launcher_client import LauncherClient
from controller.launcher_views import LauncherView, LauncherViews
from e2e.cluster.ports import free_port
from e2e.launcher_process import LauncherProcess
from e2e.waiting import wait_for
from launcher.app import ROUTES

LAUNCHER = "l1"


@pytest.fixture(scope="module")
def fma_launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LauncherProcess]:
    flags = ["--stand-in", "--mock-gpus", "2", "--stop-grace-seconds", "1", "--fma-only"]
    process = LauncherProcess(tmp_path_factory.mktemp("fma-only"), flags).start()
    yield process
    assert not process.stop(), "the launcher left processes behind"


@pytest.fixture
async def http() -> AsyncIterator[HttpCaller]:
    async with aiohttp.ClientSession() as session:
        yield HttpCaller(session, None, "ns")


def follow(process: LauncherProcess, monkeypatch: pytest.MonkeyPatch, http: HttpCaller) -> LauncherViews:
    monkeypatch.setattr(launcher_client, "launcher_url", lambda pod_ip: f"http://{pod_ip}:{process.port}")
    return LauncherViews(LauncherClient(http, None), prober=InstanceProbe(http))


async def create(process: LauncherProcess, instance: str) -> int:
    port = free_port()
    body = {"options": f"--model tiny --port {port}", "annotations": {INSTANCE_INFERENCE_PORT: str(port)}}
    async with (
        aiohttp.ClientSession() as session,
        session.put(f"{process.url}{INSTANCES_PATH}/{instance}", json=body) as r,
    ):
        assert r.status == 201, await r.text()
    return port


async def is_sleeping(port: int) -> bool:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/is_sleeping") as r:
        return bool((await r.json())["is_sleeping"])


def view(views: LauncherViews) -> LauncherView:
    found = views.get(LAUNCHER)
    assert found is not None
    return found


def serving(views: LauncherViews, instance: str) -> InstanceState | None:
    """The instance once the view knows it serves."""
    state = view(views).instances.get(instance)
    return state if state is not None and state.ready else None


def test_the_index_names_the_extension_routes_as_the_launcher_serves_them() -> None:
    """The controllers tell the two faces apart by these names: they must be the launcher's own."""
    additions = {route.name for route in ROUTES if route.addition}
    assert {SLEEP_ROUTE, WAKE_ROUTE} <= additions


async def test_an_fma_only_launchers_instance_is_learned_slept_and_woken_around_it(
    fma_launcher: LauncherProcess, monkeypatch: pytest.MonkeyPatch, http: HttpCaller
) -> None:
    views = follow(fma_launcher, monkeypatch, http)
    changes: list[str] = []
    views.subscribe(changes.append)
    running = asyncio.create_task(views.run())
    try:
        views.track(LAUNCHER, "127.0.0.1", incarnation=0)
        await wait_for(lambda: view(views).synced, what="the first list", within=10, interval=0.02)
        assert view(views).extensions is False, "an FMA-only launcher's index lacks the sleep and wake routes"

        port = await create(fma_launcher, "a")
        ready = await wait_for(lambda: serving(views, "a"), what="instance a seen serving", within=30, interval=0.05)
        assert ready is not None
        assert not ready.sleeping
        assert LAUNCHER in changes

        servers = ProviderClient(http)
        await servers.sleep("127.0.0.1", port, "r")
        views.learn(LAUNCHER, "a", sleeping=True)
        assert view(views).instances["a"].sleeping
        assert await is_sleeping(port)

        # A later list (FMA's launcher says nothing of sleep) keeps what was learned.
        views.track(LAUNCHER, "127.0.0.1", incarnation=0, signature="s1")
        views.track(LAUNCHER, "127.0.0.1", incarnation=0, signature="s2")  # the notifier saw a change: relist
        await create(fma_launcher, "b")
        await wait_for(lambda: "b" in view(views).instances, what="b listed", within=30, interval=0.05)
        assert view(views).instances["a"].ready
        assert view(views).instances["a"].sleeping

        await servers.wake("127.0.0.1", port, "r")
        views.learn(LAUNCHER, "a", sleeping=False)
        state = view(views).instances["a"]
        assert state.ready
        assert not state.sleeping
        assert not await is_sleeping(port)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        async with aiohttp.ClientSession() as session, session.delete(f"{fma_launcher.url}{INSTANCES_PATH}") as r:
            assert r.status == 200


async def test_an_asleep_instance_is_learned_asleep(
    fma_launcher: LauncherProcess, monkeypatch: pytest.MonkeyPatch, http: HttpCaller
) -> None:
    """A controller that starts while an instance sleeps (slept by an earlier one) learns it sleeps."""
    port = await create(fma_launcher, "c")
    await wait_for(lambda: is_up(port), what="c serving", within=30, interval=0.05)
    await ProviderClient(http).sleep("127.0.0.1", port, "r")
    views = follow(fma_launcher, monkeypatch, http)
    running = asyncio.create_task(views.run())
    try:
        views.track(LAUNCHER, "127.0.0.1", incarnation=0)
        state = await wait_for(lambda: serving(views, "c"), what="instance c seen", within=30, interval=0.05)
        assert state is not None
        assert state.sleeping
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        async with aiohttp.ClientSession() as session, session.delete(f"{fma_launcher.url}{INSTANCES_PATH}") as r:
            assert r.status == 200


async def is_up(port: int) -> bool:
    try:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/health") as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False
