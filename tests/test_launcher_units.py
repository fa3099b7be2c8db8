"""Pure parts of the launcher: log ranges, the event history, engine defaults, option parsing."""

import sys

import pytest

from api.launcher import EventType, InstanceState, InstanceStatus
from launcher import gpu_memory
from launcher.engine_defaults import GIB, GpuMemory, Machine, transformers_defaults, vllm_defaults
from launcher.errors import BadRequest, Gone, RangeNotSatisfiable
from launcher.events import EventLog
from launcher.logs import PAGE_BYTES, resolve_range
from launcher.runtimes import VllmRuntime


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
    assert resolve_range(header, total).content_range == expected


@pytest.mark.parametrize("header", ["bytes=-5", "bytes=5-2", "bytes=1-2,4-5", "lines=0-1", "bytes=a-b", ""])
def test_malformed_ranges(header: str) -> None:
    with pytest.raises(BadRequest):
        resolve_range(header, 100)


def test_a_range_past_the_end_is_unsatisfiable() -> None:
    with pytest.raises(RangeNotSatisfiable) as caught:
        resolve_range("bytes=100-", 100)
    assert caught.value.total == 100


def _publish(log: EventLog, count: int) -> None:
    for _ in range(count):
        state = InstanceState(status=InstanceStatus.RUNNING, instance_id="i", revision=log.next_revision(), options="")
        log.publish(EventType.CREATED, state)


def test_history_replays_after_a_revision_until_it_is_too_old() -> None:
    log = EventLog(history_size=3)
    _publish(log, 5)  # revisions 1..5, history keeps 3..5
    assert [e.object.revision for e in log.replay_since(2)] == [3, 4, 5]
    assert log.replay_since(5) == []
    assert log.replay_since(9) == []  # a watcher ahead of us waits for new events
    with pytest.raises(Gone, match="oldest event kept has revision 3"):
        log.replay_since(1)


async def test_a_watcher_gets_its_initial_events_then_live_ones() -> None:
    log = EventLog()
    _publish(log, 1)
    stream = log.subscribe(log.replay_since(0))
    _publish(log, 1)  # published after subscribing, before the first read
    log.close_all()
    assert [e.object.revision async for e in stream] == [1, 2]


async def test_a_watcher_a_whole_history_behind_is_ended() -> None:
    log = EventLog(history_size=2)
    stream = log.subscribe([])
    _publish(log, 3)
    assert [e.object.revision async for e in stream] == [2]  # the oldest dropped, then the end


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
    ],
)
def test_bad_vllm_options_are_rejected_with_vllms_message(
    vllm_runtime: VllmRuntime, options: list[str], message: str
) -> None:
    with pytest.raises(BadRequest) as caught:
        vllm_runtime.parse(options)
    assert message in caught.value.message
