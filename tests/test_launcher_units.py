"""Parts of the launcher on their own: log ranges, the event history, event bounds, engine defaults,
option parsing, the liveness watch (against real processes and a scripted /health), and the rules of the
post-wake check."""

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psutil
import pytest
from aiohttp import web

from api.launcher import (
    MAX_ANNOTATIONS_BYTES,
    MAX_EFFECTIVE_OPTIONS_BYTES,
    MAX_ENV_VARS_BYTES,
    MAX_EVENT_BYTES,
    MAX_GPU_UUIDS_BYTES,
    MAX_OPTIONS_BYTES,
    EventType,
    InstanceState,
    InstanceStatus,
    StartupTimes,
    StopReason,
    VllmConfig,
    WakeCheck,
    WakeCheckStatus,
    WakeProbe,
)
from e2e.cluster.ports import free_port
from e2e.waiting import cancel_while_waiting
from launcher import gpu_memory, liveness, startup_phases, stopping, validation
from launcher.engine_defaults import GIB, GpuMemory, Machine, transformers_defaults, vllm_defaults
from launcher.errors import (
    BadRequest,
    Conflict,
    Gone,
    InvalidOptions,
    RangeNotSatisfiable,
    UnknownGpu,
    WakeCheckFailed,
)
from launcher.events import EventLog, Subscription
from launcher.gpus import GpuInventory, naive_loader
from launcher.instance import Instance
from launcher.instances import InstanceManager, ManagerSettings
from launcher.lifecycle import Phase
from launcher.liveness import EngineProcesses, LivenessPolicy
from launcher.logs import FIRST_PAGE, PAGE_BYTES, content_range, parse_range, resolve_range
from launcher.metrics import LauncherMetrics
from launcher.process_stats import ProcessTreeStats
from launcher.runtimes import TransformersRuntime, VllmRuntime
from launcher.wake_check import (
    LOGPROB_TOLERANCE,
    PROBE_PROMPT,
    PROBE_TIMEOUT_S,
    PROBE_TOKENS,
    ProbeAnswer,
    compare,
    parse_choice,
)
from launcher.wake_verification import MAX_DETAIL_CHARS


@pytest.mark.parametrize(
    ("header", "total", "expected"),
    [
        ("bytes=0-9", 100, "bytes 0-9/100"),
        ("bytes=90-500", 100, "bytes 90-99/100"),  # an explicit end is clamped to the end of the log
        ("bytes=5-", 100, "bytes 5-99/100"),
        ("bytes=0-", 3 * PAGE_BYTES, f"bytes 0-{PAGE_BYTES - 1}/{3 * PAGE_BYTES}"),  # open end: one page
        ("bytes=7-7", 8, "bytes 7-7/8"),
    ],
)
def test_satisfiable_ranges(header: str, total: int, expected: str) -> None:
    byte_range = resolve_range(parse_range(header), total)
    assert content_range(byte_range.start, b"x" * byte_range.length, total) == expected


def test_no_range_is_the_first_page() -> None:
    assert resolve_range(FIRST_PAGE, 3 * PAGE_BYTES).length == PAGE_BYTES
    assert resolve_range(FIRST_PAGE, 30).length == 30


@pytest.mark.parametrize("header", ["bytes=-5", "bytes=5-2", "bytes=1-2,4-5", "lines=0-1", "bytes=a-b", ""])
def test_malformed_ranges(header: str) -> None:
    with pytest.raises(BadRequest):
        parse_range(header)


@pytest.mark.parametrize(("header", "total"), [("bytes=100-", 100), ("bytes=0-", 0), ("bytes=1048576-2097151", 10)])
def test_a_range_past_the_end_is_unsatisfiable(header: str, total: int) -> None:
    with pytest.raises(RangeNotSatisfiable) as caught:
        resolve_range(parse_range(header), total)
    assert caught.value.total == total


def _publish(log: EventLog, count: int) -> None:
    for _ in range(count):
        state = InstanceState(status=InstanceStatus.RUNNING, instance_id="i", revision=log.next_revision(), options="")
        log.publish(EventType.CREATED, state)


def test_history_replays_after_a_revision_until_it_is_too_old() -> None:
    log = EventLog(history_size=3)
    _publish(log, 5)  # revisions 1..5, history keeps 3..5
    assert [e.object.revision for e in log.replay_since(2)] == [3, 4, 5]  # FMA's boundary: R - history
    assert log.replay_since(5) == []  # the current revision: nothing yet, the stream stays open
    with pytest.raises(Gone, match="oldest event kept has revision 3"):
        log.replay_since(1)  # R - history - 1


@pytest.mark.parametrize("since", [-1, 6, 987654])
def test_a_revision_this_launcher_never_had_is_gone(since: int) -> None:
    """Ahead of the current revision: the client's launcher restarted (its revisions began again)."""
    log = EventLog(history_size=3)
    _publish(log, 5)
    with pytest.raises(Gone):
        log.replay_since(since)


def test_a_fresh_log_serves_since_0_and_nothing_beyond() -> None:
    log = EventLog()
    assert log.replay_since(0) == []
    with pytest.raises(Gone, match="ahead of this launcher's current revision 0"):
        log.replay_since(987654)


def test_every_event_carries_the_boot_id_of_its_launcher_process() -> None:
    first, second = EventLog(), EventLog()
    assert uuid.UUID(first.boot_id) != uuid.UUID(second.boot_id)
    _publish(first, 2)
    assert {e.boot_id for e in first.replay_since(0)} == {first.boot_id}


async def _drain(subscription: Subscription) -> list[int]:
    revisions = []
    while (event := await subscription.next(1.0)) is not None:
        revisions.append(event.object.revision)
    return revisions


async def test_a_watcher_gets_its_initial_events_then_live_ones() -> None:
    log = EventLog()
    _publish(log, 1)
    subscription = log.subscribe(log.replay_since(0))
    _publish(log, 1)  # published after subscribing, before the first read
    log.close_all()
    assert await _drain(subscription) == [1, 2]


async def test_an_idle_watcher_times_out_and_loses_nothing() -> None:
    """The API sends a heartbeat each time `next` times out; the event that comes later still arrives."""
    log = EventLog()
    subscription = log.subscribe([])
    with pytest.raises(TimeoutError):
        await subscription.next(0.05)
    _publish(log, 1)
    event = await subscription.next(0.05)
    assert event is not None
    assert event.object.revision == 1
    subscription.close()
    _publish(log, 1)  # no longer queued for it
    with pytest.raises(TimeoutError):
        await subscription.next(0.05)


async def test_a_watcher_a_whole_history_behind_is_ended() -> None:
    log = EventLog(history_size=2)
    subscription = log.subscribe([])
    _publish(log, 3)
    assert await _drain(subscription) == [2]  # the oldest dropped, then the end


def test_the_largest_event_the_bounds_allow_fits_a_watch_line() -> None:
    """Every bounded field at its bound, and the launcher's own fields at their longest."""
    env = {f"E{i:04d}": "x" * 10 for i in range(MAX_ENV_VARS_BYTES // 21)}  # "E0000":"xxxxxxxxxx", is 21 bytes
    state = InstanceState(
        status=InstanceStatus.STOPPED,
        instance_id="i" * 128,
        revision=2**63 - 1,
        options="o" * (MAX_OPTIONS_BYTES - 2),
        gpu_uuids=["G" * 40] * (MAX_GPU_UUIDS_BYTES // 43),
        env_vars=env,
        annotations={"a": "v" * (MAX_ANNOTATIONS_BYTES - 10)},
        runtime="transformers",
        ready=True,
        sleeping=True,
        sleep_level=2,
        effective_options="e" * (MAX_EFFECTIVE_OPTIONS_BYTES - 2),
        # Every flag the engine defaults can add, with its longest value.
        defaults_applied={
            "--max-model-len": "auto",
            "--dtype": "bfloat16",
            "--kv-cache-memory-bytes": str(2**63),
            "--enforce-eager": "true",
            "--enable-sleep-mode": "true",
            "--gpu-memory-utilization": "0.95",
        },
        port=65535,
        exit_code=-(2**31),
        stop_reason=max(StopReason, key=len),
        # A probe of the whole prompt in single bytes, 7-digit token IDs, and the longest detail, all escaped.
        wake_check=WakeCheck(
            status=WakeCheckStatus.UNAVAILABLE,
            probe=WakeProbe(
                prompt_token_ids=[9_999_999] * (len(PROBE_PROMPT.encode()) + 1),
                token_ids=[9_999_999] * PROBE_TOKENS,
                logprobs=[-1.2345678901234567e-300] * PROBE_TOKENS,
            ),
            passed=2**63 - 1,
            last_seconds=1.2345678901234567e300,
            detail="\x01" * MAX_DETAIL_CHARS,
        ),
    )
    for name, value, bound in [
        ("options", state.options, MAX_OPTIONS_BYTES),
        ("effective_options", state.effective_options, MAX_EFFECTIVE_OPTIONS_BYTES),
        ("env_vars", state.env_vars, MAX_ENV_VARS_BYTES),
        ("annotations", state.annotations, MAX_ANNOTATIONS_BYTES),
        ("gpu_uuids", state.gpu_uuids, MAX_GPU_UUIDS_BYTES),
    ]:
        assert bound - 64 <= validation.encoded_size(value) <= bound, name
    event = EventLog().event(EventType.STOPPED, state, exit_code=-(2**31))
    assert len(event.model_dump_json(exclude_none=True).encode()) + 1 <= MAX_EVENT_BYTES


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"": "x"}, "'' is not a valid environment variable name"),
        ({"A=B": "x"}, "'A=B' is not a valid environment variable name"),
        ({"TAB\tNAME": "x"}, "is not a valid environment variable name"),
        ({"ÜBER": "x"}, "'ÜBER' is not a valid environment variable name"),
        ({"OK": "a\0b"}, "the value of OK contains a NUL byte"),
        ({"BIG": "v" * MAX_ENV_VARS_BYTES}, f"over the launcher's bound of {MAX_ENV_VARS_BYTES} bytes"),
    ],
)
def test_environments_no_process_could_have_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(BadRequest, match="env_vars") as caught:
        validation.check_environment(env)
    assert message in caught.value.message


def test_environment_names_kubernetes_accepts_are_accepted() -> None:
    validation.check_environment({"1ST": "", "my.var-x": "é\n", "PATH": "/bin", "a b": "x"})


@pytest.mark.parametrize(
    ("port", "message"),
    [(0, "--port 0 is not a port"), (-1, "--port -1 is not a port"), (99999, "--port 99999 is not a port"),
     (8123, "--port 8123 is this launcher's own API port")],
)  # fmt: skip
def test_ports_an_instance_cannot_serve_on_are_refused(port: int, message: str) -> None:
    with pytest.raises(InvalidOptions) as caught:
        validation.check_port(port, own_port=8123)
    assert message in caught.value.message


def test_a_port_another_process_listens_on_is_in_use() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with pytest.raises(Conflict, match=f"port {port} is already in use on 127.0.0.1") as caught:
            validation.check_port_free("127.0.0.1", port)
    assert caught.value.reason == "PortInUse"
    validation.check_port_free("127.0.0.1", port)  # closed now: free


CPU = Machine(on_cpu=True, cpu_kv_cache_bytes=1 << 20)


def gpu(free_gib: float, total_gib: float = 80) -> GpuMemory:
    return GpuMemory(free_bytes=int(free_gib * GIB), total_bytes=int(total_gib * GIB))


def test_cpu_defaults_fill_only_what_the_user_left_out() -> None:
    chosen = vllm_defaults(frozenset(), CPU)
    assert chosen.chosen == {
        "--max-model-len": "auto",
        "--dtype": "float32",
        "--kv-cache-memory-bytes": str(1 << 20),
        "--enforce-eager": "true",
    }
    everything = frozenset({"max_model_len", "dtype", "gpu_memory_utilization", "enforce_eager"})
    assert vllm_defaults(everything, CPU).flags == []


@pytest.mark.parametrize(
    ("gpus", "reserve_gib", "expected"),
    [
        ([gpu(80)], 0, "0.95"),  # an empty GPU: capped at 0.95
        ([gpu(40)], 0, "0.49"),  # half used by others: (40 GiB - 600 MiB) / 80 GiB, rounded down
        ([gpu(40)], 4, "0.44"),  # two sleepers allowed, 2 GiB each, kept free
        ([gpu(80), gpu(20)], 0, "0.24"),  # the tightest GPU decides
        ([gpu(1)], 2, "0.00"),  # nothing left: never negative
        (None, 0, "0.84"),  # unmeasurable (KAITO's fallback)
    ],
)
def test_gpu_memory_utilization_from_free_memory_minus_the_sleepers_reserve(
    gpus: list[GpuMemory] | None, reserve_gib: int, expected: str
) -> None:
    machine = Machine(on_cpu=False, gpus=gpus, sleeper_reserve_bytes=reserve_gib * GIB)
    assert vllm_defaults(frozenset(), machine).chosen["--gpu-memory-utilization"] == expected


def test_gpu_defaults_turn_on_sleep_mode_and_respect_the_user() -> None:
    machine = Machine(on_cpu=False, gpus=[gpu(80)])
    assert vllm_defaults(frozenset(), machine).chosen["--enable-sleep-mode"] == "true"
    user_set = frozenset({"enable_sleep_mode", "kv_cache_memory_bytes", "max_model_len"})
    assert vllm_defaults(user_set, machine).flags == []
    assert "--dtype" not in vllm_defaults(frozenset(), machine).chosen  # the GPU's own default dtype


def test_transformers_defaults() -> None:
    assert transformers_defaults(frozenset(), CPU).flags == []
    assert transformers_defaults(frozenset(), Machine(on_cpu=False)).chosen == {"--dtype": "bfloat16"}
    assert transformers_defaults(frozenset({"dtype"}), Machine(on_cpu=False)).flags == []


async def test_gpu_memory_is_measured_in_a_subprocess_and_parsed() -> None:
    printer = [sys.executable, "-c", "print('[[1024, 4096], [2048, 4096]]')"]
    assert await gpu_memory.measure("0,1", command=printer) == [GpuMemory(1024, 4096), GpuMemory(2048, 4096)]
    failing = [sys.executable, "-c", "raise SystemExit('no CUDA here')"]
    assert await gpu_memory.measure(None, command=failing) is None


@pytest.fixture(scope="module")
def vllm_runtime() -> VllmRuntime:
    runtime = VllmRuntime()
    runtime.preload()
    return runtime


def test_explicit_flags_are_found_in_any_spelling(vllm_runtime: VllmRuntime) -> None:
    parsed = vllm_runtime.parse(["--model", "/", "--max_model_len=64", "--no-enforce-eager", "--port", "9"])
    assert {"model", "max_model_len", "enforce_eager", "port"} <= parsed.explicit
    assert "dtype" not in parsed.explicit
    assert parsed.values.max_model_len == 64


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--port", "abc"], "argument --port: invalid int value: 'abc'"),
        (["--model", "/no/such/model"], "model path /no/such/model does not exist"),
        (["--model", "/", "--enable-sleep-mode"], "--enable-sleep-mode is not supported by vLLM on the CPU"),
        (["--model", "/", "--enable-log-outputs"], "--enable-log-outputs requires --enable-log-requests"),
        # What the launcher could not reach: it talks plain HTTP to the instance's --port.
        (["--model", "/", "--uds", "/tmp/x.sock"], "--uds (a Unix socket instead of the port) is not supported"),
        (["--model", "/", "--grpc"], "--grpc (gRPC instead of HTTP on the port) is not supported"),
        (["--model", "/", "--ssl-keyfile", "/k"], "--ssl-keyfile (HTTPS) is not supported"),
    ],
)
def test_bad_vllm_options_are_rejected_with_vllms_message(
    vllm_runtime: VllmRuntime, options: list[str], message: str
) -> None:
    with pytest.raises(BadRequest) as caught:
        vllm_runtime.parse(options)
    assert message in caught.value.message


def test_a_model_whose_weights_link_to_nothing_is_refused_before_the_fork(
    vllm_runtime: VllmRuntime, tmp_path: Path
) -> None:
    """As a hub cache's snapshot whose blob was removed; an unreadable file is refused the same way, naming the
    launcher's user (as root here everything is readable: e2e/test_real_images.py runs the image's user)."""
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").symlink_to(tmp_path / "blobs" / "gone")
    with pytest.raises(BadRequest) as caught:
        vllm_runtime.parse(["--model", str(tmp_path)])
    assert caught.value.message == (
        f"invalid options: model path {tmp_path}: {tmp_path}/model.safetensors is a symbolic link to nothing"
    )


# ----- liveness

# A server process that forks one "engine" child titled ENGINE_TITLE; the child dies with its parent,
# as an instance's processes do (process_control.die_with_parent).
ENGINE_TITLE = "TESTENGINE::core"
TREE_SCRIPT = f"""
import os, sys, time, setproctitle
from launcher import process_control
if os.fork() == 0:
    process_control.die_with_parent()
    setproctitle.setproctitle({ENGINE_TITLE!r})
    time.sleep(600)
    os._exit(0)
print("forked", flush=True)
time.sleep(600)
"""


@pytest.fixture
def server_tree() -> Iterator[EngineProcesses]:
    server = subprocess.Popen([sys.executable, "-c", TREE_SCRIPT], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert server.stdout is not None
        assert server.stdout.readline() == b"forked\n"
        deadline = time.monotonic() + 10
        while True:  # the child sets its title a moment after the fork
            processes = EngineProcesses.find(server.pid, lambda title: title.startswith("TESTENGINE::"))
            if (processes is not None and processes.engine) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert processes is not None
        assert processes.titles == (ENGINE_TITLE,)
        yield processes
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


async def _healthy() -> str | None:
    return None


async def _watch(processes: EngineProcesses) -> liveness.Verdict | None:
    """The watch's verdict (None: the server itself died); its health checks always pass, so it ends only on a death
    (a pidfd says at once, a poll within POLL_S; 10 s only says it ended)."""
    return await asyncio.wait_for(liveness.watch(processes, _healthy, LivenessPolicy()), 10)


async def test_an_engine_process_that_dies_while_its_server_lives_is_reported_at_once(
    server_tree: EngineProcesses,
) -> None:
    watching = asyncio.ensure_future(_watch(server_tree))
    await asyncio.sleep(0.1)
    assert not watching.done()
    os.kill(server_tree.engine[0].pid, signal.SIGKILL)
    verdict = await watching
    assert verdict is not None
    assert verdict.reason is StopReason.ENGINE_DIED
    assert f"process {server_tree.engine[0].pid} ({ENGINE_TITLE})" in verdict.message


async def test_without_pidfds_the_engine_is_polled(
    server_tree: EngineProcesses, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_pidfds(pid: int, flags: int = 0) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfds)
    watching = asyncio.ensure_future(_watch(server_tree))
    await asyncio.sleep(0.1)
    os.kill(server_tree.engine[0].pid, signal.SIGKILL)
    verdict = await watching
    assert verdict is not None
    assert verdict.reason is StopReason.ENGINE_DIED


async def test_an_engine_that_dies_with_its_server_is_no_engine_death(server_tree: EngineProcesses) -> None:
    """The server died first (SIGCHLD reports that exit); its engine died of the parent-death signal."""
    watching = asyncio.ensure_future(_watch(server_tree))
    await asyncio.sleep(0.1)
    os.kill(server_tree.server.pid, signal.SIGKILL)
    assert await watching is None
    psutil.wait_procs(list(server_tree.engine), timeout=5)


class ScriptedHealth:
    """/health answers from a script: None is healthy, a string a failure; the last entry repeats."""

    def __init__(self, *answers: str | None) -> None:
        self.answers = list(answers)
        self.calls: list[float] = []

    async def __call__(self) -> str | None:
        self.calls.append(asyncio.get_running_loop().time())
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


FAST = LivenessPolicy(health_interval_s=0.02, health_timeout_s=0.02, failure_threshold=3)
NO_ENGINE = EngineProcesses(psutil.Process(), (), ())  # this process as the server, no engine processes


@pytest.mark.looptime  # the probes' rate is the loop's clock, whatever the machine does
async def test_consecutive_health_failures_make_an_instance_unresponsive() -> None:
    probe = ScriptedHealth(
        None, "no answer within 2 s", "no answer within 2 s", None, "refused", "refused", "it answered 503"
    )
    verdict = await asyncio.wait_for(liveness.watch(NO_ENGINE, probe, FAST), 5)
    assert verdict is not None
    assert verdict.reason is StopReason.UNRESPONSIVE
    assert "/health failed 3 times in a row" in verdict.message
    assert "last: it answered 503" in verdict.message
    assert len(probe.calls) == 7  # the success in between started the count again
    # Probes run at a fixed rate from each probe's start (one delayed by the machine is followed by a shorter gap).
    span = probe.calls[-1] - probe.calls[0]
    assert span == pytest.approx((len(probe.calls) - 1) * FAST.health_interval_s)


@pytest.mark.looptime  # 0.5 s of the loop's clock is 25 probes, however busy the machine is
async def test_a_healthy_instance_is_never_judged() -> None:
    probe = ScriptedHealth(None)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(liveness.watch(NO_ENGINE, probe, FAST), 0.5)
    assert len(probe.calls) >= 25  # every 0.02 s, and none of them judged it


def test_a_liveness_policy_must_be_able_to_fire() -> None:
    with pytest.raises(ValueError, match="invalid liveness policy"):
        LivenessPolicy(failure_threshold=0)


# ----- the post-wake check


def _answer(tokens: list[int], logprobs: list[float] | None = None, runner_up: float = -3.0) -> ProbeAnswer:
    runners_up: list[tuple[int, float] | None] | None = None
    if logprobs is not None:
        runners_up = [(t + 1, runner_up) for t in tokens]
    return ProbeAnswer([1, 2, 3], tokens, logprobs, runners_up)


@pytest.mark.parametrize(
    ("replayed", "problem"),
    [
        (_answer([5, 6, 7], [-0.5, -1.0, -0.2]), None),
        (_answer([5, 6, 7], [-0.5 + LOGPROB_TOLERANCE / 2, -1.0, -0.2]), None),  # within the tolerance
        (_answer([5, 6, 7], [-0.5, -1.5, -0.2]), "token 1 (6) has log-probability -1.5000, recorded -1.0000"),
        (_answer([5, 9, 7], [-0.5, -1.0, -0.2]), "token 1 is 9, recorded 6"),
        (_answer([5, 7, 7], [-0.5, -3.0, -0.2]), "token 1 is 7, recorded 6"),  # the runner-up, far behind
        (_answer([5, 6], [-0.5, -1.0]), "the answer has 2 tokens [5, 6], recorded [5, 6, 7]"),
    ],
)
def test_a_replayed_probe_must_answer_as_recorded(replayed: ProbeAnswer, problem: str | None) -> None:
    recorded = _answer([5, 6, 7], [-0.5, -1.0, -0.2])
    found = compare(recorded, replayed)
    assert found == problem if problem is None else problem in (found or "")


def test_a_near_tie_may_go_the_other_way() -> None:
    """Recorded: token 6 at -1.0 and its runner-up 7 at -1.05; a replay that takes 7 there parts from it, and passes."""
    recorded = _answer([5, 6, 7], [-0.5, -1.0, -0.2], runner_up=-1.05)
    assert compare(recorded, _answer([5, 7, 42, 43], [-0.5, -1.05, -2.0, -2.0])) is None
    assert compare(recorded, _answer([5, 8, 42], [-0.5, -1.05, -2.0])) is not None  # not the runner-up


def test_without_logprobs_the_tokens_alone_are_compared() -> None:
    recorded = _answer([5, 6, 7])
    assert compare(recorded, _answer([5, 6, 7])) is None
    assert compare(recorded, _answer([5, 6, 8])) == "token 2 is 8, recorded 7 (answer [5, 6, 8], recorded [5, 6, 7])"


def test_a_vllm_completion_choice_is_read_with_its_runners_up() -> None:
    choice = {
        "text": " a b",
        "token_ids": [11, 12],
        "prompt_token_ids": [1, 2],
        "logprobs": {
            "tokens": ["token_id:11", "token_id:12"],
            "token_logprobs": [-0.1, -0.2],
            "top_logprobs": [{"token_id:11": -0.1, "token_id:40": -2.0}, {"token_id:12": -0.2}],
        },
    }
    answer = parse_choice(choice, logprobs=True)
    assert answer == ProbeAnswer([1, 2], [11, 12], [-0.1, -0.2], [(40, -2.0), None])
    assert parse_choice({"text": "", "token_ids": [3], "prompt_token_ids": None}, logprobs=False) == ProbeAnswer(
        None, [3]
    )
    with pytest.raises(ValueError, match="not a list of token IDs"):
        parse_choice({"text": "no ids"}, logprobs=False)


# ----- start-up phases


def test_a_phase_not_marked_is_counted_in_the_next_one() -> None:
    marks = [
        startup_phases.Mark(startup_phases.FORKED, 10.5),
        startup_phases.Mark(startup_phases.CONFIGURED, 11.0),
        startup_phases.Mark(startup_phases.LISTENING, 14.0),  # weights, KV cache and warm-up unmarked
        startup_phases.Mark(startup_phases.LISTENING, 15.0),  # a later repeat changes nothing
    ]
    assert startup_phases.startup_phases(10.0, marks, 14.25) == {
        "fork": 0.5, "engine_config": 0.5, "api_listening": 3.0, "first_healthy": 0.25,
    }  # fmt: skip


def test_runtime_log_lines_mark_phases_and_the_bytes_a_sleep_moved(tmp_path: Path) -> None:
    """The hook sees records whatever the logger's handlers (none here, and propagation off)."""
    marks_file = tmp_path / "marks"
    original = logging.Logger.callHandlers
    try:
        startup_phases.record_marks(marks_file, (*VllmRuntime.markers, *TransformersRuntime.markers))
        quiet = logging.getLogger("vllm.test.quiet")
        quiet.propagate, quiet.level = False, logging.INFO
        quiet.info("Loading weights took %.2f seconds", 0.07)
        quiet.info("CPU KV cache size: 65,536 tokens, Maximum concurrency for 256 tokens per request: 256.00x")
        quiet.info("Sleep mode freed %.2f GiB memory, %.2f GiB memory is still in use.", 1.5, 0.25)
        quiet.info("level 1: %.1f MB of weights to host memory", 3.3)
        quiet.debug("Loading weights took 9 seconds")  # below INFO: not a mark
    finally:
        logging.Logger.callHandlers = original  # type: ignore[method-assign]
    marks = startup_phases.read_marks(marks_file)
    assert [m.name for m in marks] == ["forked", "weights_loaded", "kv_cache_profiled", "slept", "slept"]
    assert startup_phases.moved_bytes(marks, startup_phases.SLEPT, since=marks[3].at) == 3_300_000
    assert startup_phases.moved_bytes(marks[:4], startup_phases.SLEPT, since=0) == int(1.5 * 2**30)
    assert startup_phases.moved_bytes(marks, startup_phases.WOKE, since=0) is None


# Cancellations that arrive while the launcher waits on an instance --------------------------------------------

NO_PROCESS = 2**22 + 1  # above any pid_max: a signal to it would find no process
# Stops on SIGTERM, a moment later (a server shutting down); never longer than 30 s.
SLOW_TO_STOP = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.4), sys.exit(0)))
print("up", flush=True)
time.sleep(30)
"""


@pytest.fixture
async def manager(tmp_path: Path) -> AsyncIterator[InstanceManager]:
    settings = ManagerSettings(host="127.0.0.1", port=free_port(), state_dir=tmp_path, zygote=False)
    manager = InstanceManager({}, GpuInventory("no GPUs", naive_loader(0)), LauncherMetrics(), EventLog(), settings)
    yield manager
    await manager.servers.close()


def _instance(tmp_path: Path, pid: int, port: int = 0) -> Instance:
    """An instance just created (STARTING)."""
    instance = Instance(
        id="inst-1", config=VllmConfig(options="--model m"), argv=[], defaults_applied={}, port=port, pid=pid,
        work_dir=tmp_path, temp_dir=tmp_path, created_at=time.monotonic(), stats=ProcessTreeStats(pid),
        runtime_name="vllm", startup=StartupTimes(forked_by="launcher"),
    )  # fmt: skip
    instance.move(Phase.STARTING)
    return instance


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """An instance's server process, in its own process group as the launcher's are."""
    process = subprocess.Popen([sys.executable, "-c", SLOW_TO_STOP], stdout=subprocess.PIPE, start_new_session=True)
    assert process.stdout is not None
    assert process.stdout.readline() == b"up\n"
    yield process
    if process.returncode is None:
        process.kill()
        process.wait()
    process.stdout.close()


async def _reap(manager: InstanceManager, instance: Instance, child: subprocess.Popen[bytes]) -> None:
    """As the launcher's reaper does when SIGCHLD comes."""
    async with asyncio.timeout(5):
        code = await asyncio.to_thread(child.wait)
    manager._on_exit(instance, code)


async def test_a_stop_cancelled_during_the_grace_period_ends_cancelled_and_the_instance_still_exits(
    manager: InstanceManager, tmp_path: Path, child: subprocess.Popen[bytes]
) -> None:
    instance = _instance(tmp_path, child.pid)
    await cancel_while_waiting(asyncio.create_task(manager.stopper.stop(instance)))
    await _reap(manager, instance, child)  # the SIGTERM it got before the cancellation stands
    assert (instance.status, instance.exit_code) == (InstanceStatus.STOPPED, 0)


async def test_a_call_cancelled_while_it_waits_for_a_dead_instances_exit_code_ends_cancelled(
    manager: InstanceManager, tmp_path: Path
) -> None:
    """A sleep or wake forwarded to an instance judged unresponsive waits a moment for its exit code; its
    caller going away meanwhile ends the call as cancelled, not as a BackendTimeout."""
    instance = _instance(tmp_path, pid=NO_PROCESS, port=free_port())  # nothing listens there
    instance.stop_reason = StopReason.UNRESPONSIVE
    await cancel_while_waiting(asyncio.create_task(manager.servers.call(instance, "POST", "/sleep")))


async def test_a_failed_wake_check_cancelled_while_it_waits_for_the_exit_code_still_killed_the_instance(
    manager: InstanceManager, tmp_path: Path, child: subprocess.Popen[bytes]
) -> None:
    instance = _instance(tmp_path, child.pid, port=free_port())  # nothing answers the probe there
    instance.probe = ProbeAnswer([1, 2, 3], [5, 6, 7])
    checking = asyncio.create_task(manager.verifier.check(instance, TransformersRuntime()))
    await cancel_while_waiting(checking)  # the reaper has not seen the exit yet
    await _reap(manager, instance, child)
    assert (instance.exit_code, instance.stop_reason) == (-signal.SIGKILL, StopReason.WAKE_CHECK_FAILED)


SLOW_ANSWER_S = 2 * PROBE_TIMEOUT_S  # a probe answered later than a replay may take
SLOW_PROBE = ProbeAnswer([1, 2], [5, 6, 7, 8], [-1.0] * 4)


@contextlib.asynccontextmanager
async def answering_the_probe_after(delay_s: float) -> AsyncIterator[int]:
    """A model server on a free port (yielded) that answers /v1/completions with SLOW_PROBE after `delay_s`."""

    async def complete(request: web.Request) -> web.Response:
        await asyncio.sleep(delay_s)
        named = [f"token_id:{token}" for token in SLOW_PROBE.token_ids]
        table = {"tokens": named, "token_logprobs": SLOW_PROBE.logprobs, "top_logprobs": [{n: -1.0} for n in named]}
        choice = {"prompt_token_ids": SLOW_PROBE.prompt_token_ids, "token_ids": SLOW_PROBE.token_ids, "logprobs": table}
        return web.json_response({"choices": [{**choice, "finish_reason": "length"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield port
    finally:
        await runner.cleanup()


@pytest.mark.looptime  # the server's delay and the probe's bounds are the loop's seconds: a busy machine is no slower
async def test_a_first_probe_slower_than_a_replay_may_be_is_recorded(manager: InstanceManager, tmp_path: Path) -> None:
    """The first answer carries the runtime's warm-up (vLLM's on a busy CPU took 34 s): a slow one is recorded,
    and the instance's wakes are checked, not reported unavailable."""
    async with answering_the_probe_after(SLOW_ANSWER_S) as port:
        instance = _instance(tmp_path, pid=NO_PROCESS, port=port)
        started = asyncio.get_running_loop().time()
        await manager.verifier.record(instance, VllmRuntime())
        assert asyncio.get_running_loop().time() - started >= SLOW_ANSWER_S
    assert (instance.wake_check.status, instance.wake_check.probe) == (WakeCheckStatus.RECORDED, SLOW_PROBE.recorded())


@pytest.mark.looptime
async def test_a_replay_slower_than_its_bound_fails_the_check(
    manager: InstanceManager, tmp_path: Path, child: subprocess.Popen[bytes]
) -> None:
    async with answering_the_probe_after(SLOW_ANSWER_S) as port:
        instance = _instance(tmp_path, child.pid, port=port)
        instance.probe = SLOW_PROBE
        no_answer = f"no answer to POST /v1/completions within {PROBE_TIMEOUT_S:g} s"
        with pytest.raises(WakeCheckFailed, match=no_answer):
            await manager.verifier.check(instance, VllmRuntime())
    assert instance.stop_reason is StopReason.WAKE_CHECK_FAILED


@pytest.mark.looptime  # the copy's 0.3 s and the bounds are the loop's seconds
async def test_a_wait_for_the_output_copy_cancelled_ends_cancelled_and_the_copy_goes_on(tmp_path: Path) -> None:
    instance = _instance(tmp_path, pid=NO_PROCESS)
    copied = asyncio.Event()

    async def copy() -> None:
        await asyncio.sleep(0.3)
        copied.set()

    instance.output = asyncio.create_task(copy())
    await cancel_while_waiting(asyncio.create_task(stopping.copied(instance)))
    async with asyncio.timeout(2):
        await instance.output
    assert copied.is_set()


@pytest.mark.looptime
async def test_a_copy_cancelled_by_the_launchers_shutdown_ends_the_wait_for_it(tmp_path: Path) -> None:
    instance = _instance(tmp_path, pid=NO_PROCESS)
    instance.output = asyncio.create_task(asyncio.sleep(30))
    waiting = asyncio.create_task(stopping.copied(instance))
    await asyncio.sleep(0.05)
    instance.output.cancel()
    async with asyncio.timeout(1):
        await waiting  # returns: no CancelledError


class _CountedSource:
    """A GPU source that counts its reads and answers each when `release` is set (an API read or NVML's init)."""

    def __init__(self, answers: list[dict[str, int] | Exception]) -> None:
        self.answers = answers
        self.reads = 0
        self.release = asyncio.Event()

    async def load(self) -> dict[str, int]:
        self.reads += 1
        await self.release.wait()
        answer = self.answers[min(self.reads, len(self.answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer


async def test_gpus_read_early_are_one_read_that_the_first_instance_joins() -> None:
    source = _CountedSource([{"GPU-a": 0, "GPU-b": 1}])
    inventory = GpuInventory("test source", source.load)
    inventory.read_early()
    await asyncio.sleep(0)
    assert source.reads == 1, "the read starts with the launcher, before any instance asks"
    waiting = [asyncio.ensure_future(inventory.indices(["GPU-b"])) for _ in range(3)]
    await asyncio.sleep(0.01)
    source.release.set()
    assert await asyncio.gather(*waiting) == [[1], [1], [1]]
    assert await inventory.indices(["GPU-a", "GPU-b"]) == [0, 1]
    assert source.reads == 1, "every caller shared the one read"


async def test_gpus_an_unknown_uuid_or_a_failed_read_reads_the_source_again() -> None:
    source = _CountedSource([RuntimeError("API server unreachable"), {"GPU-a": 0}, {"GPU-a": 0, "GPU-new": 1}])
    source.release.set()
    inventory = GpuInventory("test source", source.load)
    inventory.read_early()
    assert await inventory.indices(["GPU-a"]) == [0], "the failed early read is read again"
    assert await inventory.indices(["GPU-new"]) == [1], "a GPU added to the source since is found"
    assert source.reads == 3
    with pytest.raises(UnknownGpu, match=r"unknown GPU UUID.*GPU-gone.*available.*GPU-a, GPU-new"):
        await inventory.indices(["GPU-gone"])
