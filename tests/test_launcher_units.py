"""Pure parts of the launcher: log ranges, the event history, engine defaults, option parsing."""

import pytest

from api.launcher import EventType, InstanceState, InstanceStatus
from launcher.engine_defaults import cpu_defaults, gpu_defaults
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


def test_cpu_defaults_fill_only_what_the_user_left_out() -> None:
    chosen = cpu_defaults(frozenset(), kv_cache_bytes=1 << 20)
    assert chosen.flags == ["--dtype", "float32", "--kv-cache-memory-bytes", str(1 << 20), "--enforce-eager"]
    user_set = cpu_defaults(frozenset({"dtype", "gpu_memory_utilization", "enforce_eager"}), kv_cache_bytes=1)
    assert user_set.flags == []


def test_gpu_defaults_turn_on_sleep_mode_unless_the_user_decided() -> None:
    assert gpu_defaults(frozenset()).chosen == {"--enable-sleep-mode": "true"}
    assert gpu_defaults(frozenset({"enable_sleep_mode"})).flags == []


@pytest.fixture(scope="module")
def vllm_runtime() -> VllmRuntime:
    runtime = VllmRuntime(cpu_kv_cache_bytes=1 << 26)
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
