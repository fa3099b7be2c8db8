"""The launcher's instance life cycle (its transition table, and the events its moves publish) and its
admission plan (a pure decision over a request, the instances held and the GPU facts)."""

import argparse
import asyncio
import itertools
import re
import time
from collections import deque
from pathlib import Path

import aiohttp
import pytest

from api.launcher import ErrorReason, EventType, InstanceStatus, StartupTimes, VllmConfig
from e2e.cluster.ports import free_port
from e2e.simulation.instances import LedgerLog, simulated_instances
from launcher import admission, lifecycle
from launcher.admission import GpuFacts, Held, LauncherFacts, Request
from launcher.engine_defaults import GIB, EngineDefaults, GpuMemory, Machine, vllm_defaults
from launcher.errors import BadRequest, Conflict, InvalidOptions
from launcher.gpus import GpuInventory, naive_loader
from launcher.instance import Instance
from launcher.instance_server import InstanceServers
from launcher.instances import InstanceManager, ManagerSettings
from launcher.lifecycle import TRANSITIONS, IllegalTransition, Phase
from launcher.liveness import LivenessPolicy
from launcher.metrics import LauncherMetrics
from launcher.monitor import Monitor, Supervision
from launcher.process_stats import ProcessTreeStats
from launcher.runtimes import ParsedOptions, Runtime
from launcher.stopping import Stopper
from launcher.wake_check import ProbeAnswer
from launcher.wake_verification import WakeVerifier

# The life cycle ------------------------------------------------------------------------------------------------


def _paths() -> dict[Phase, list[Phase]]:
    """For every phase reachable from the first, the phases on a shortest way there."""
    paths = {lifecycle.FIRST: [lifecycle.FIRST]}
    queue = deque([lifecycle.FIRST])
    while queue:
        current = queue.popleft()
        for source, target in TRANSITIONS:
            if source is current and target not in paths:
                paths[target] = [*paths[current], target]
                queue.append(target)
    return paths


def test_every_phase_and_every_declared_transition_is_reachable_from_the_first() -> None:
    paths = _paths()
    assert set(paths) == set(Phase)
    assert all(source in paths for source, _ in TRANSITIONS)


Published = list[tuple[EventType, int | None]]


def _instance(published: Published) -> Instance:
    return Instance(
        id="i", config=VllmConfig(options="--model m"), argv=[], defaults_applied={}, port=1, pid=0,
        work_dir=Path("/nonexistent"), temp_dir=Path("/nonexistent"), created_at=time.monotonic(),
        stats=ProcessTreeStats(0), runtime_name="vllm", startup=StartupTimes(forked_by="launcher"),
        publish=lambda _, event, exit_code: published.append((event, exit_code)),
    )  # fmt: skip


def _at(phase: Phase, published: Published) -> Instance:
    instance = _instance(published)
    for step in _paths()[phase][1:]:
        instance.move(step)
    published.clear()
    return instance


@pytest.mark.parametrize(("source", "target"), list(TRANSITIONS), ids=lambda p: str(p))
def test_a_declared_transition_moves_the_instance_and_publishes_its_event(source: Phase, target: Phase) -> None:
    published: Published = []
    instance = _at(source, published)
    exit_code = 7 if TRANSITIONS[source, target] is EventType.STOPPED else None
    instance.move(target, exit_code=exit_code)
    assert instance.phase is target
    assert published == [(TRANSITIONS[source, target], exit_code)]


def test_from_any_phase_an_event_leads_to_one_phase_at_most() -> None:
    """What `after` relies on: a stop or a deletion is told by its event, and the table picks the phase."""
    for (source, target), event in TRANSITIONS.items():
        assert lifecycle.after(source, event) is target
    with pytest.raises(IllegalTransition, match="cannot publish STOPPED from new"):
        lifecycle.after(Phase.NEW, EventType.STOPPED)


# A read that waited for what it must not would wait until the test lets that go on, i.e. past any bound: this one is
# only far beyond what the event loop of a loaded machine may take to run a few awaits.
NOT_WAITING_S = 5.0
UNDECLARED = [pair for pair in itertools.product(Phase, Phase) if pair not in TRANSITIONS]


@pytest.mark.parametrize(("source", "target"), UNDECLARED, ids=lambda p: str(p))
def test_an_undeclared_transition_is_refused_and_changes_nothing(source: Phase, target: Phase) -> None:
    with pytest.raises(IllegalTransition):
        lifecycle.event_of(source, target)
    published: Published = []
    instance = _at(source, published)
    with pytest.raises(IllegalTransition, match=f"from {source} to {target}"):
        instance.move(target)
    assert (instance.phase, published) == (source, [])


@pytest.fixture
def simulated(tmp_path: Path) -> tuple[InstanceManager, LedgerLog]:
    """The launcher's instance manager with the simulation's forker injected (no process behind an instance), and its
    event log."""
    events = LedgerLog(history_size=100)
    settings = ManagerSettings(host="127.0.0.1", port=free_port(), state_dir=tmp_path, zygote=False)
    manager = simulated_instances(GpuInventory("no GPUs", naive_loader(0)), LauncherMetrics(), events, settings)
    events.instances = manager.snapshot
    return manager, events


async def test_a_stop_a_delete_causes_publishes_nothing_and_the_deletion_reports_it(
    simulated: tuple[InstanceManager, LedgerLog],
) -> None:
    manager, events = simulated
    await manager.create(VllmConfig(options=f"--model m --port {free_port()}"), "a")
    async with asyncio.timeout(NOT_WAITING_S):
        while not manager.get("a").ready:  # noqa: ASYNC110 - the forker's move, polled
            await asyncio.sleep(0.01)
    deleted = await manager.delete("a")
    assert [entry.event for entry in events.ledger] == [EventType.CREATED, EventType.READY, EventType.DELETED]
    assert (deleted.status, deleted.exit_code) == (InstanceStatus.STOPPED, 0)


@pytest.mark.parametrize(
    ("phase", "status", "ready", "sleeping"),
    [
        (Phase.NEW, InstanceStatus.RUNNING, False, False),
        (Phase.STARTING, InstanceStatus.RUNNING, False, False),
        (Phase.AWAKE, InstanceStatus.RUNNING, True, False),
        (Phase.ASLEEP, InstanceStatus.RUNNING, True, True),
        (Phase.STOPPED, InstanceStatus.STOPPED, False, False),
        (Phase.STOPPED_ASLEEP, InstanceStatus.STOPPED, False, True),
        (Phase.DELETED, InstanceStatus.STOPPED, False, False),
        (Phase.DELETED_ASLEEP, InstanceStatus.STOPPED, False, True),
    ],
)
def test_the_state_on_the_wire_is_what_the_phase_says(
    phase: Phase, status: InstanceStatus, ready: bool, sleeping: bool
) -> None:
    state = _at(phase, []).state()
    assert (state.status, state.ready, state.sleeping) == (status, ready, sleeping)


def test_a_stopped_instance_still_says_it_slept_and_at_which_level() -> None:
    published: Published = []
    instance = _at(Phase.AWAKE, published)
    instance.sleep_level = 2
    instance.move(Phase.ASLEEP)
    instance.exited_with(-9)
    instance.deleted()
    state = instance.state()
    assert (state.status, state.ready, state.sleeping, state.sleep_level) == (InstanceStatus.STOPPED, False, True, 2)
    assert (state.exit_code, instance.end.exited) == (-9, True)
    assert published == [(EventType.SLEEPING, None), (EventType.STOPPED, -9), (EventType.DELETED, None)]


def test_an_instance_stopped_awake_says_it_does_not_sleep() -> None:
    instance = _at(Phase.AWAKE, [])
    instance.exited_with(0)
    instance.deleted()
    assert (instance.phase, instance.state().sleeping) == (Phase.DELETED, False)


def test_a_wake_forgets_the_sleep_level() -> None:
    instance = _at(Phase.AWAKE, [])
    instance.sleep_level = 1
    instance.move(Phase.ASLEEP)
    instance.move(Phase.AWAKE)
    state = instance.state()
    assert (state.sleeping, state.sleep_level) == (False, None)


def test_the_architecture_drawing_is_the_transition_table() -> None:
    text = (Path(__file__).parent.parent / "docs" / "architecture.md").read_text()
    found = re.search(r"<!-- instance-phases:begin -->\n```mermaid\n(.*?)\n```\n<!-- instance-phases:end -->", text,
                      re.DOTALL)  # fmt: skip
    assert found, "docs/architecture.md has no drawing between the instance-phases:begin/end markers"
    assert found.group(1) == lifecycle.mermaid(), "docs/architecture.md's instance drawing is stale: paste mermaid()"


# The sleep state, found by the instance's watch -------------------------------------------------------------------


class _Server(InstanceServers):
    """An instance's server that says whether it sleeps as the test sets it, and answers the probe when it lets it."""

    def __init__(self) -> None:
        super().__init__("127.0.0.1", backend_timeout_seconds=1)
        self.sleeping = False
        self.answering = True
        self.probe_asked, self.probe_answers = asyncio.Event(), asyncio.Event()

    async def ask_probe(
        self, instance: Instance, prompt: str | list[int], logprobs: bool, limit: aiohttp.ClientTimeout
    ) -> ProbeAnswer:
        self.probe_asked.set()
        await self.probe_answers.wait()
        return ProbeAnswer(prompt_token_ids=[1], token_ids=[2])

    async def is_sleeping(self, instance: Instance) -> bool | None:
        return self.sleeping

    async def health(self, instance: Instance, timeout_s: float) -> str | None:
        return None if self.answering else "ClientConnectorError: connection refused"


class _Verifier(WakeVerifier):
    """A post-wake check that passes when the test lets it."""

    def __init__(self, servers: InstanceServers) -> None:
        super().__init__(servers, Stopper(grace_seconds=0), LauncherMetrics())
        self.started, self.passes = asyncio.Event(), asyncio.Event()

    async def check(self, instance: Instance, runtime: Runtime) -> None:
        self.started.set()
        await self.passes.wait()


def _monitor(instance: Instance, server: _Server, verifier: WakeVerifier) -> Monitor:
    """The instance's monitor, whose sleep-state watch looks only when a read asks (its interval is a minute)."""
    supervision = Supervision(
        server, verifier, verifier.stopper, verifier.metrics, LivenessPolicy(health_interval_s=60)
    )
    return Monitor(instance, RUNTIME, supervision)


@pytest.mark.looptime  # the watch's moves are bounded in the loop's seconds, whatever the machine does
async def test_a_sleep_the_server_reports_is_recorded_at_once_but_a_wake_only_once_the_watch_has_checked_it() -> None:
    published: Published = []
    instance = _at(Phase.AWAKE, published)
    server = _Server()
    verifier = _Verifier(server)
    monitor = _monitor(instance, server, verifier)
    async with asyncio.TaskGroup() as group:
        watch = group.create_task(monitor.watch_sleep())
        await asyncio.sleep(0)
        server.sleeping = True
        monitor.reported(True)  # as its server does, before it answers the sleep
        assert (instance.phase, published) == (Phase.ASLEEP, [(EventType.SLEEPING, None)])
        server.sleeping = False
        monitor.reported(False)
        assert instance.phase is Phase.ASLEEP, "a wake is not recorded on the server's word"
        async with asyncio.timeout(1):
            await verifier.started.wait()  # the watch looked at once, and checks the wake
        assert instance.phase is Phase.ASLEEP, "until its check passed"
        verifier.passes.set()
        async with asyncio.timeout(1):
            while instance.phase is Phase.ASLEEP:  # noqa: ASYNC110 - the watch's move, polled
                await asyncio.sleep(0.01)
        assert published[-1] == (EventType.AWAKE, None)
        watch.cancel()


async def test_a_sleep_reported_from_the_servers_first_answer_is_recorded_after_its_ready() -> None:
    """FMA's controller polls a new server's /health itself and may put it to sleep before the launcher has
    seen it ready, and while the launcher records its post-wake probe (the instance's lock held)."""
    published: Published = []
    instance = _at(Phase.STARTING, published)
    server = _Server()
    monitor = _monitor(instance, server, _Verifier(server))
    monitor.reported(True)
    assert (instance.phase, published) == (Phase.ASLEEP, [(EventType.READY, None), (EventType.SLEEPING, None)])
    assert instance.startup.total_seconds is not None, "its start-up is timed at the report"

    recorded: Published = []
    recording = _at(Phase.AWAKE, recorded)
    verifier = _Verifier(server)
    monitor = _monitor(recording, server, verifier)
    async with asyncio.TaskGroup() as group:
        probe = group.create_task(verifier.record(recording, RUNTIME))  # holds the instance's lock
        await server.probe_asked.wait()
        monitor.reported(True)
        assert (recording.phase, recorded) == (Phase.ASLEEP, [(EventType.SLEEPING, None)])
        assert recording.lock.locked(), "while the probe was recorded"
        server.probe_answers.set()
        await probe


async def test_a_sleep_the_launcher_asked_for_itself_is_recorded_by_the_launcher_not_by_the_report() -> None:
    published: Published = []
    instance = _at(Phase.AWAKE, published)
    server = _Server()
    monitor = _monitor(instance, server, _Verifier(server))
    async with instance.lock:  # as the launcher's own sleep holds it, until it moves the instance itself
        monitor.reported(True)
        assert (instance.phase, published) == (Phase.AWAKE, [])


# The admission plan --------------------------------------------------------------------------------------------

LAUNCHER = LauncherFacts(host="127.0.0.1", port=8001, cpu_kv_cache_bytes=GIB)
NOTHING_HELD = Held(ids=(), ports={})


class _GpuRuntime(Runtime):
    """vLLM's defaults on a GPU over a parser of the flags they read."""

    name = "vllm"
    on_cpu = False

    def preload(self) -> None:
        pass

    def make_parser(self) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser()
        parser.add_argument("--model", required=True)
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--host", default=None)
        parser.add_argument("--gpu-memory-utilization", type=float)
        return parser

    def serve(self, argv: list[str]) -> None:
        raise AssertionError("never served here")

    def defaults(self, parsed: ParsedOptions, machine: Machine) -> EngineDefaults:
        return vllm_defaults(parsed.explicit, machine)

    def wants_gpu_memory(self, parsed: ParsedOptions) -> bool:
        return True


RUNTIME = _GpuRuntime()


def _request(options: str = "--model m --port 8005", instance_id: str = "a", **fields: object) -> Request:
    config = VllmConfig.model_validate({"options": options, **fields})
    return admission.read(config, instance_id, {"vllm": RUNTIME}, LAUNCHER, NOTHING_HELD)


def test_a_plan_adds_the_defaults_the_gpu_memory_allows_and_the_launchers_host() -> None:
    memory = [GpuMemory(free_bytes=70 * GIB, total_bytes=80 * GIB)]
    request = _request(gpu_uuids=["GPU-b"], gpu_sleeper_reserve_bytes=10 * GIB)
    plan = admission.plan(request, GpuFacts(indices=[3], memory=memory), LAUNCHER, NOTHING_HELD)
    assert plan.argv == [
        "--model", "m", "--port", "8005", "--max-model-len", "auto", "--enable-sleep-mode",
        "--gpu-memory-utilization", "0.74", "--host", "127.0.0.1",
    ]  # fmt: skip
    assert (plan.instance_id, plan.port, plan.env) == ("a", 8005, {"CUDA_VISIBLE_DEVICES": "3"})
    assert plan.config.env_vars == {"CUDA_VISIBLE_DEVICES": "3"}, "the devices are echoed in the state"
    assert plan.defaults.chosen["--gpu-memory-utilization"] == "0.74"


def test_a_plan_without_gpus_named_leaves_the_environment_as_asked() -> None:
    request = _request(env_vars={"A": "1"})
    plan = admission.plan(request, GpuFacts(), LAUNCHER, NOTHING_HELD)
    assert plan.env == {"A": "1"}
    assert plan.config is request.config


def test_a_plan_refuses_a_port_another_running_instance_holds_and_an_id_taken_meanwhile() -> None:
    request = _request()
    with pytest.raises(Conflict, match="port 8005 is already used by instance other") as port:
        admission.plan(request, GpuFacts(), LAUNCHER, Held(ids=("other",), ports={8005: "other"}))
    assert port.value.reason is ErrorReason.PORT_IN_USE
    with pytest.raises(Conflict, match="Instance a already exists") as taken:
        admission.plan(request, GpuFacts(), LAUNCHER, Held(ids=("a",), ports={}))
    assert taken.value.reason is ErrorReason.ALREADY_EXISTS


def test_a_plan_refuses_an_environment_no_process_can_have() -> None:
    with pytest.raises(BadRequest, match="not a valid environment variable name"):
        admission.plan(_request(env_vars={"A=B": "1"}), GpuFacts(), LAUNCHER, NOTHING_HELD)


@pytest.mark.parametrize(
    ("options", "instance_id", "error", "message"),
    [
        ("--model m", "-bad", BadRequest, "invalid instance ID"),
        ("--model 'm", "a", InvalidOptions, "cannot split"),
        ("--model m --host 10.0.0.1", "a", InvalidOptions, "is not this launcher's address"),
        ("--model m --port 8001", "a", InvalidOptions, "this launcher's own API port"),
    ],
)
def test_reading_a_request_refuses_its_first_fault(
    options: str, instance_id: str, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        _request(options, instance_id)


def test_reading_a_request_refuses_an_unknown_runtime_and_a_taken_id() -> None:
    with pytest.raises(BadRequest, match="unknown runtime 'nope'; this launcher runs: vllm"):
        _request(runtime="nope")
    config = VllmConfig(options="--model m")
    with pytest.raises(Conflict, match="Instance a already exists"):
        admission.read(config, "a", {"vllm": RUNTIME}, LAUNCHER, Held(ids=("a",), ports={}))
