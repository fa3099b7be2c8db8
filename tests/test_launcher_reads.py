"""A read of the launcher (its instance routes: the IDs, the detailed list, one instance's state) returns what was
recorded and never acts: it asks no instance's server, waits for no look, changes no state and kills nothing.

The instance here is monitored as a forked one is (`monitor`), behind an injected forker with no process: it sleeps
(its server reported so), and its server lies (it says it is awake, and its probe answers otherwise), so a read that
looked at it would take the lie for a wake, check it, find it failed and kill the instance.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from api.launcher import StartupTimes, VllmConfig, WakeCheck, WakeCheckStatus
from e2e.cluster.ports import free_port
from launcher.admission import Admission
from launcher.app import build_app
from launcher.events import EventLog
from launcher.forking import Forked, Spawn
from launcher.gpus import GpuInventory, naive_loader
from launcher.instance import Instance, InstanceExited
from launcher.instance_server import InstanceServers
from launcher.instances import InstanceManager, ManagerSettings
from launcher.lifecycle import Phase
from launcher.liveness import LivenessPolicy, Verdict
from launcher.metrics import LauncherMetrics
from launcher.monitor import Monitor, Supervision
from launcher.process_stats import ProcessTreeStats
from launcher.runtimes import Runtime, StandInRuntime
from launcher.stopping import Stopper
from launcher.wake_check import ProbeAnswer
from launcher.wake_verification import WakeVerifier

BASE = "/v2/vllm/instances"
NO_PROCESS = 2**22 + 1  # above any pid_max: nothing may signal it
NOT_WAITING_S = 5.0  # far beyond a few awaits on a loaded machine; a read that waited on the server would hang
RECORDED = ProbeAnswer(prompt_token_ids=[1, 2], token_ids=[3, 4])


class _LyingServer(InstanceServers):
    """Says the instance is awake and answers the probe otherwise than at its first ready; never answers a look."""

    def __init__(self) -> None:
        super().__init__("127.0.0.1", backend_timeout_seconds=1)
        self.asked: list[str] = []
        self.never = asyncio.Event()

    async def is_sleeping(self, instance: Instance) -> bool | None:
        self.asked.append("is_sleeping")
        await self.never.wait()
        return False

    async def health(self, instance: Instance, timeout_s: float) -> str | None:
        self.asked.append("health")
        return None

    async def ask_probe(
        self, instance: Instance, prompt: str | list[int], logprobs: bool, limit: aiohttp.ClientTimeout
    ) -> ProbeAnswer:
        self.asked.append("probe")
        return ProbeAnswer(prompt_token_ids=[1, 2], token_ids=[9, 9])


class _Stopper(Stopper):
    """Records the kills it is asked for; a stop (the launcher's shutdown) ends the instance at once (it has no
    process to signal)."""

    def __init__(self) -> None:
        super().__init__(grace_seconds=0)
        self.killed: list[str] = []

    def kill(self, instance: Instance, verdict: Verdict) -> None:
        self.killed.append(verdict.message)

    async def stop(self, instance: Instance) -> None:
        if instance.running:
            instance.end.ask_to_stop()
            instance.exited_with(0)

    def signal(self, instance: Instance, signum: int) -> None:
        raise AssertionError("no process to signal")


class _MonitoredForker:
    """The forker protocol: no process, but each instance watched by its monitor, as a forked one is."""

    def __init__(self, supervision: Supervision) -> None:
        self.supervision = supervision
        self.monitors: dict[str, Monitor] = {}

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def fork(self, admitted: Admission, work_dir: Path) -> Forked:
        return Forked(NO_PROCESS, work_dir, ProcessTreeStats(NO_PROCESS), StartupTimes(forked_by="test"), True)

    def supervise(self, instance: Instance, runtime: Runtime, spawn: Spawn) -> None:
        monitor = self.monitors[instance.id] = Monitor(instance, runtime, self.supervision)
        spawn(self._watch(instance, monitor))

    @staticmethod
    async def _watch(instance: Instance, monitor: Monitor) -> None:
        with contextlib.suppress(InstanceExited):  # it stopped (the launcher's shutdown): its watch is over
            await instance.end.while_running(monitor.watch_sleep())


@pytest.fixture
async def launcher(tmp_path: Path) -> AsyncIterator[tuple[TestClient[Any, Any], _LyingServer, _Stopper, Instance]]:
    """The launcher's API over one instance that sleeps, whose server lies; its sleep-state watch looks only once a
    minute (not within the test), so whatever looks at the server in the test is a read."""
    server, stopper, metrics = _LyingServer(), _Stopper(), LauncherMetrics()
    verifier = WakeVerifier(server, stopper, metrics)
    supervision = Supervision(server, verifier, stopper, metrics, LivenessPolicy(health_interval_s=60))
    forker = _MonitoredForker(supervision)
    settings = ManagerSettings(host="127.0.0.1", port=free_port(), state_dir=tmp_path, zygote=False)
    runtime = StandInRuntime()
    runtime.preload()
    manager = InstanceManager(
        {"vllm": runtime}, GpuInventory("no GPUs", naive_loader(0)), metrics, EventLog(), settings,
        servers=server, stopper=stopper, forker=forker,
    )  # fmt: skip
    await manager.create(VllmConfig(options=f"--model m --port {free_port()}"), "liar")
    instance = manager.get("liar")
    instance.probe = RECORDED  # as recorded at its first ready
    instance.wake_check = WakeCheck(status=WakeCheckStatus.RECORDED, probe=RECORDED.recorded())
    forker.monitors["liar"].reported(True)  # its server's report: it slept (READY, then SLEEPING)
    assert instance.phase is Phase.ASLEEP
    async with TestClient(TestServer(build_app(manager))) as client:
        yield client, server, stopper, instance
    server.never.set()


async def test_reads_of_a_sleeping_instance_whose_server_lies_change_nothing_and_kill_nothing(
    launcher: tuple[TestClient[Any, Any], _LyingServer, _Stopper, Instance],
) -> None:
    client, server, stopper, instance = launcher
    revision = instance.revision
    async with asyncio.timeout(NOT_WAITING_S):
        for _ in range(3):
            async with client.get(f"{BASE}/liar") as response:
                one = await response.json()
            async with client.get(BASE, params={"detail": "true"}) as response:
                listed = await response.json()
            async with client.get(BASE, params={"detail": "false"}) as response:
                ids = await response.json()
            await asyncio.sleep(0.05)  # room for anything a read would have set going
    assert (one["status"], one["sleeping"], one["revision"]) == ("running", True, revision)
    assert [(s["instance_id"], s["sleeping"]) for s in listed["instances"]] == [("liar", True)]
    assert (ids["instance_ids"], listed["revision"], ids["revision"]) == (["liar"], revision, revision)
    assert server.asked == [], "a read asked the instance's server"
    assert stopper.killed == []
    assert (instance.phase, instance.revision, instance.stop_reason) == (Phase.ASLEEP, revision, None)
    assert (instance.wake_check.passed, instance.wake_check.detail) == (0, None)
