"""Simulated Nodes without a cluster: the address carving, the simulated launcher's and requester's HTTP
surfaces (the real apps, over no process), and the kubelet's simulation processes (restarted when they die)."""

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from e2e.kubelet.addresses import AddressBlock, SubnetCarver
from e2e.kubelet.config import KubeletConfig, SimulationConfig
from e2e.kubelet.simulation import SimulationClient, Simulations, url_files
from e2e.simulation.container import ContainerFiles, StartFailure
from e2e.simulation.control import Simulation
from e2e.simulation.launcher import LauncherContainer
from e2e.simulation.protocol import KILLED, ContainerSpec, Mount
from e2e.simulation.requester import RequesterContainer
from e2e.waiting import cancel_while_waiting, wait_for

TOKEN = "launcher-s3cret"
TOKEN_DIR = "/var/run/secrets/dualpods/launcher-token"
BASE = "/v2/vllm/instances"


def test_carver_gives_each_node_a_subnet_of_a_claimed_block(tmp_path: Path) -> None:
    carver = SubnetCarver(tmp_path)
    try:
        blocks = [carver.carve() for _ in range(SubnetCarver.BLOCK_SUBNETS + 1)]
        networks = {b.network for b in blocks}
        assert len(networks) == len(blocks)
        assert all(n.prefixlen == 24 for n in networks)
        first, last = blocks[0], blocks[-1]
        assert str(first.host_ip).endswith(".0.1")
        assert str(first.allocate()).endswith(".0.2")
        assert first.network.network_address.packed[1] != last.network.network_address.packed[1], "a second block"
        # Those blocks are claimed: a cluster started meanwhile gets others.
        other = AddressBlock.claim(tmp_path)
        assert other.network.network_address.packed[1] not in {n.network_address.packed[1] for n in networks}
        other.release_block()
    finally:
        carver.release_blocks()


def test_container_files_follow_the_deepest_mount(tmp_path: Path) -> None:
    spec = _spec("requester", "127.0.0.1", tmp_path, mounts=[
        Mount(source=str(tmp_path / "a"), target="/var/run"),
        Mount(source=str(tmp_path / "b"), target="/var/run/secrets/x"),
    ])  # fmt: skip
    files = ContainerFiles(spec)
    assert files.host_path("/var/run/secrets/x/token") == tmp_path / "b" / "token"
    assert files.host_path("/var/run/other") == tmp_path / "a" / "other"
    assert files.host_path("/etc/hosts") == Path("/etc/hosts")


@pytest.fixture
def pod_ip() -> Iterator[str]:
    block = AddressBlock.claim()  # the machine-wide claim: no other cluster uses these addresses now
    yield str(block.allocate())
    block.release_block()


def _spec(role: str, pod_ip: str, tmp_path: Path, args: list[str] | None = None,
          env: dict[str, str] | None = None, mounts: list[Mount] | None = None) -> ContainerSpec:  # fmt: skip
    return ContainerSpec.model_validate({
        "id": f"{role}-1", "role": role, "namespace": "ns", "pod": f"{role}-pod", "uid": f"uid-{role}",
        "container": "inference-server", "pod_ip": pod_ip, "args": args or [], "env": env or {},
        "mounts": mounts or [], "log": str(tmp_path / "logs" / f"{role}.log"),
    })  # fmt: skip


@pytest.fixture
async def launcher(tmp_path: Path, pod_ip: str) -> AsyncIterator[tuple[LauncherContainer, aiohttp.ClientSession]]:
    secret = tmp_path / "token-volume"
    secret.mkdir()
    (secret / "token").write_text(TOKEN)
    env = {"LAUNCHER_HOST": pod_ip, "LAUNCHER_AUTH_TOKEN_FILE": f"{TOKEN_DIR}/token"}
    container = LauncherContainer(
        _spec("launcher", pod_ip, tmp_path, ["--mock-gpus", "2"], env, [Mount(source=str(secret), target=TOKEN_DIR)]),
        tmp_path / "state",
    )
    await container.start()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(f"http://{pod_ip}:8001", headers=headers) as session:
        yield container, session
    assert await container.stop(5) == 0


async def _put(http: aiohttp.ClientSession, instance: str, options: str, **body: Any) -> tuple[int, dict[str, Any]]:
    async with http.put(f"{BASE}/{instance}", json={"options": options, **body}) as answer:
        return answer.status, await answer.json()


async def test_simulated_launcher_answers_the_launcher_api(
    launcher: tuple[LauncherContainer, aiohttp.ClientSession],
) -> None:
    container, http = launcher
    url = f"http://{container.spec.pod_ip}:8001{BASE}"
    async with aiohttp.ClientSession() as anonymous, anonymous.get(url) as answer:
        assert answer.status == 401
    status, state = await _put(http, "a", "--model m --port 8005 --startup-delay 0.3", gpu_uuids=["GPU-1"])
    assert status == 201
    assert state["ready"] is False
    assert state["env_vars"]["CUDA_VISIBLE_DEVICES"] == "1"
    status, _ = await _put(http, "b", "--model m --startup-delay 30 --port 8006")
    assert status == 201
    async with http.post(f"{BASE}/b/sleep") as answer:
        assert answer.status == 409
        assert (await answer.json())["reason"] == "NotReady"
    assert (await _put(http, "a", "--model m --port 8007"))[1]["reason"] == "AlreadyExists"
    assert (await _put(http, "c", "--model m --port 8005"))[1]["reason"] == "PortInUse"
    assert (await _put(http, "d", "--model m --port 8008", gpu_uuids=["GPU-7"]))[1]["reason"] == "UnknownGPU"
    assert (await _put(http, "e", "--model m --port 8009 --host 127.0.0.1"))[1]["reason"] == "InvalidOptions"

    async with http.get(f"{BASE}/watch") as watch:
        events = [json.loads(await watch.content.readline()) for _ in range(2)]
        assert {e["type"] for e in events} == {"CREATED"}
        assert len({e["boot_id"] for e in events}) == 1
        seen = (await asyncio.wait_for(watch.content.readline(), 5)).strip()
        assert json.loads(seen)["type"] == "READY"
        assert json.loads(seen)["object"]["instance_id"] == "a"
        async with http.post(f"{BASE}/a/sleep") as answer:
            assert answer.status == 200
            assert (await answer.json())["sleeping"] is True
        async with http.post(f"{BASE}/a/wake_up") as answer:
            assert (await answer.json())["sleeping"] is False
        async with http.delete(f"{BASE}/a") as answer:
            assert answer.status == 200
        types = [json.loads(await watch.content.readline())["type"] for _ in range(3)]
        assert types == ["SLEEPING", "AWAKE", "DELETED"]
    report = container.report()
    assert [i.instance_id for i in report.instances] == ["b"]
    async with http.get(f"{BASE}/b/log") as answer:
        assert "simulated instance b" in await answer.text()


async def _state(http: aiohttp.ClientSession, instance: str) -> dict[str, Any]:
    async with http.get(f"{BASE}/{instance}") as answer:
        state: dict[str, Any] = await answer.json()
        return state


async def _ready(http: aiohttp.ClientSession, instance: str) -> bool:
    return bool((await _state(http, instance))["ready"])


async def _is_sleeping(pod_ip: str, port: int) -> bool:
    async with aiohttp.ClientSession() as http, http.get(f"http://{pod_ip}:{port}/is_sleeping") as answer:
        return bool((await answer.json())["is_sleeping"])


async def test_a_ready_instance_answers_vllms_sleep_routes_on_its_port(
    launcher: tuple[LauncherContainer, aiohttp.ClientSession],
) -> None:
    """As FMA's controller reaches an instance: /is_sleeping once it is up, /sleep and /wake_up, which the launcher
    records; the port closes when the instance goes."""
    container, http = launcher
    pod_ip = container.spec.pod_ip
    assert (await _put(http, "a", "--model m --port 8005 --startup-delay 0.5"))[0] == 201
    with pytest.raises(aiohttp.ClientConnectionError):
        await _is_sleeping(pod_ip, 8005)
    await wait_for(lambda: _ready(http, "a"), what="instance a ready", within=10, interval=0.05)
    assert await _is_sleeping(pod_ip, 8005) is False
    async with aiohttp.ClientSession(f"http://{pod_ip}:8005") as server:
        async with server.post("/sleep?level=1") as answer:
            assert answer.status == 200
        assert (await _state(http, "a"))["sleeping"] is True
        assert await _is_sleeping(pod_ip, 8005) is True
        async with server.post("/wake_up") as answer:
            assert answer.status == 200
        assert (await _state(http, "a"))["sleeping"] is False
    async with http.delete(f"{BASE}/a") as answer:
        assert answer.status == 200
    with pytest.raises(aiohttp.ClientConnectionError):
        await _is_sleeping(pod_ip, 8005)


@pytest.mark.parametrize(
    ("command", "env", "exit_code", "logged"),
    [
        (["python3", "/app/launcher_pod_notifier.py"], {"NAMESPACE": "ns"}, 1, "POD_NAME"),
        (["python3", "/app/launcher_pod_notifier.py"],
         {"POD_NAME": "p", "NAMESPACE": "ns", "KUBERNETES_SERVICE_HOST": "10.96.0.1"}, 1, "not a loopback address"),
        (["python3", "/app/launcher_pod_notifier.py"], {"POD_NAME": "p", "NAMESPACE": "ns",
         "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "1"}, 1, "Service token file"),
        (["sh", "-c", "true"], {}, 127, "cannot run sh -c true"),
    ],
)  # fmt: skip
async def test_a_launcher_containers_command_picks_what_the_simulation_runs(
    tmp_path: Path, pod_ip: str, command: list[str], env: dict[str, str], exit_code: int, logged: str
) -> None:
    """FMA's notifier sidecar (`python3 /app/launcher_pod_notifier.py` in the launcher's image) is run as the
    notifier, which needs its Pod's name, the API server on a loopback address and its ServiceAccount token; another
    command exits as a missing program would."""
    spec = _spec("launcher", pod_ip, tmp_path, env=env).model_copy(update={"command": command})
    started = await Simulation("launcher", tmp_path / "state").start(spec)
    assert started.exit_code == exit_code
    assert logged in Path(spec.log).read_text()


async def test_a_stopped_launcher_stops_serving(tmp_path: Path, pod_ip: str) -> None:
    container = LauncherContainer(_spec("launcher", pod_ip, tmp_path, ["--mock-gpus", "1"], {"LAUNCHER_HOST": pod_ip}),
                                  tmp_path / "state")  # fmt: skip
    await container.start()
    assert await container.stop(5) == 0
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as http, http.get(f"http://{pod_ip}:8001/health"):
            pass


async def test_simulated_requester_serves_its_spi_and_records_readiness(tmp_path: Path, pod_ip: str) -> None:
    env = {
        "POD_IP": pod_ip,
        "REQUESTER_SPI_AUTH": "none",
        "NVIDIA_VISIBLE_DEVICES": "GPU-a",
        "REQUESTER_GPU_SOURCE": "env",
    }
    container = RequesterContainer(_spec("requester", pod_ip, tmp_path, env=env), tmp_path / "state")
    await container.start()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://{pod_ip}:8081/v1/dual-pods/accelerators") as answer:
                assert await answer.json() == ["GPU-a"]
            async with http.get(f"http://{pod_ip}:8080/ready") as answer:
                assert answer.status == 503
            async with http.post(f"http://{pod_ip}:8081/v1/become-ready") as answer:
                assert answer.status == 200
            async with http.get(f"http://{pod_ip}:8080/ready") as answer:
                assert answer.status == 200
        report = container.report()
        assert report.ready
        assert [ready for _, ready in report.transitions] == [True]
    finally:
        assert await container.stop(5) == 0


async def test_simulated_requester_refuses_unauthenticated_changes(tmp_path: Path, pod_ip: str) -> None:
    env = {"POD_IP": pod_ip, "NVIDIA_VISIBLE_DEVICES": "GPU-a", "REQUESTER_GPU_SOURCE": "env",
           "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "1"}  # fmt: skip
    container = RequesterContainer(_spec("requester", pod_ip, tmp_path, env=env), tmp_path / "state")
    await container.start()
    try:
        async with aiohttp.ClientSession() as http, http.post(f"http://{pod_ip}:8081/v1/become-ready") as answer:
            assert answer.status == 401
            assert (await answer.json())["reason"] == "Unauthenticated"
        assert not container.report().ready
    finally:
        await container.stop(5)


async def test_bad_arguments_fail_the_start_as_the_program_would(tmp_path: Path, pod_ip: str) -> None:
    container = RequesterContainer(_spec("requester", pod_ip, tmp_path, ["--spi-port", "0"]), tmp_path / "state")
    with pytest.raises(StartFailure) as failure:
        await container.start()
    assert failure.value.exit_code == 2
    assert "--spi-port" in str(failure.value)


async def test_kubelet_restarts_a_simulation_that_dies(tmp_path: Path, pod_ip: str) -> None:
    config = KubeletConfig(kubeconfig=tmp_path / "kubeconfig", state_dir=tmp_path, api_server_port=1)
    simulations = Simulations(config, SimulationConfig())
    await simulations.start()
    env = {"POD_IP": pod_ip, "REQUESTER_SPI_AUTH": "none", "REQUESTER_GPU_SOURCE": "env"}
    try:
        first = await simulations.run(_spec("requester", pod_ip, tmp_path, env=env))
        assert first.container_id == "simulated://requester/requester-1"
        assert await first.stop(5) == 0
        second = await simulations.run(_spec("requester", pod_ip, tmp_path, env=env))
        process = simulations.processes["requester"][0]
        assert process.pid is not None
        os.kill(process.pid, signal.SIGKILL)
        assert await asyncio.wait_for(second.wait(), 10) == KILLED
        third = await simulations.run(_spec("requester", pod_ip, tmp_path, env=env))  # waits for the new process
        async with aiohttp.ClientSession() as http, http.get(f"http://{pod_ip}:8080/ready") as answer:
            assert answer.status == 503
        assert await third.stop(5) == 0
        failing = await simulations.run(_spec("requester", pod_ip, tmp_path, ["--probes-port", "x"], env))
        assert await failing.wait() == 2
        assert "--probes-port" in Path(_spec("requester", pod_ip, tmp_path).log).read_text()
    finally:
        await simulations.close()


async def test_a_roles_pods_are_spread_over_its_processes_and_each_reports_its_own(tmp_path: Path) -> None:
    block = AddressBlock.claim()
    config = KubeletConfig(kubeconfig=tmp_path / "kubeconfig", state_dir=tmp_path, api_server_port=1)
    simulations = Simulations(config, SimulationConfig(processes_per_role=2))
    await simulations.start()
    specs = []
    for i in range(6):
        pod_ip = str(block.allocate())
        env = {"POD_IP": pod_ip, "REQUESTER_SPI_AUTH": "none", "REQUESTER_GPU_SOURCE": "env"}
        spec = _spec("requester", pod_ip, tmp_path, env=env)
        specs.append(spec.model_copy(update={"id": f"r{i}-1", "pod": f"r{i}", "uid": f"uid-r{i}"}))
    try:
        containers = [await simulations.run(spec) for spec in specs]
        async with aiohttp.ClientSession() as http:
            for spec in specs:  # each on its own address, whichever process serves it
                async with http.get(f"http://{spec.pod_ip}:8080/ready") as answer:
                    assert answer.status == 503
            clients = [SimulationClient(f.read_text().strip(), http) for f in url_files(tmp_path, "requester")]
            served = [sorted(r.pod for r in (await client.report()).requesters) for client in clients]
        assert len(served) == 2
        assert all(served), f"both processes serve some of the Pods: {served}"
        assert sorted(served[0] + served[1]) == [f"r{i}" for i in range(6)], "each Pod by exactly one process"
        for spec, container in zip(specs, containers, strict=True):  # a restart goes to the same process
            assert await container.stop(5) == 0
            again = spec.model_copy(update={"id": spec.id.replace("-1", "-2")})
            assert simulations.process_of(again) is simulations.process_of(spec)
    finally:
        await simulations.close()
        block.release_block()


async def test_a_report_since_a_time_holds_the_requesters_whose_readiness_changed_since(tmp_path: Path) -> None:
    """A benchmark polls each second for the requesters told ready since its last look, not all of them."""
    block = AddressBlock.claim()
    config = KubeletConfig(kubeconfig=tmp_path / "kubeconfig", state_dir=tmp_path, api_server_port=1)
    simulations = Simulations(config, SimulationConfig())
    await simulations.start()
    specs = []
    for name in ("told", "waiting"):
        pod_ip = str(block.allocate())
        env = {"POD_IP": pod_ip, "REQUESTER_SPI_AUTH": "none", "REQUESTER_GPU_SOURCE": "env"}
        spec = _spec("requester", pod_ip, tmp_path, env=env)
        specs.append(spec.model_copy(update={"id": f"{name}-1", "pod": name, "uid": f"uid-{name}"}))
    try:
        containers = [await simulations.run(spec) for spec in specs]
        async with aiohttp.ClientSession() as http:
            (url_file,) = url_files(tmp_path, "requester")
            client = SimulationClient(url_file.read_text().strip(), http)
            before = time.time()
            async with http.post(f"http://{specs[0].pod_ip}:8081/v1/become-ready") as answer:
                assert answer.status == 200
            changed = (await client.report(changed_since=before)).requesters
            assert [(r.pod, r.ready) for r in changed] == [("told", True)]
            assert (await client.report(changed_since=time.time() + 1)).requesters == []
            assert sorted(r.pod for r in (await client.report()).requesters) == ["told", "waiting"]
            async with http.get(f"{client.url}/report", params={"changed_since": "soon"}) as answer:
                assert answer.status == 400
                assert "changed_since" in await answer.text()
        for container in containers:
            assert await container.stop(5) == 0
    finally:
        await simulations.close()
        block.release_block()


async def _slow_to_clean_up(cleaning: asyncio.Event) -> web.AppRunner:
    """A server whose shutdown hangs (a handler that does not end within the grace period)."""

    async def hang(_: web.Application) -> None:
        cleaning.set()
        await asyncio.sleep(30)

    app = web.Application()
    app.on_cleanup.append(hang)
    runner = web.AppRunner(app)
    await runner.setup()
    return runner


@pytest.mark.parametrize("role", ["launcher", "requester"])
async def test_a_stop_cancelled_within_its_grace_period_ends_cancelled(tmp_path: Path, role: str) -> None:
    """The kubelet's control call going away mid-stop cancels the stop: the cancellation comes out, and the
    stop reports neither a clean exit nor a kill it did not do."""
    cleaning = asyncio.Event()
    runner = await _slow_to_clean_up(cleaning)
    container: LauncherContainer | RequesterContainer
    if role == "launcher":
        container = LauncherContainer(_spec(role, "127.0.0.1", tmp_path), tmp_path / "state")
        container._runner = runner
    else:
        container = RequesterContainer(_spec(role, "127.0.0.1", tmp_path), tmp_path / "state")
        container._runners = [runner]
    stopping = asyncio.create_task(container.stop(30))
    async with asyncio.timeout(2):
        await cleaning.wait()
    await cancel_while_waiting(stopping, settle=0)
