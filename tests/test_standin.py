"""The stand-in inference server behaves like vLLM where tests rely on it: as a separate process,
driven by vLLM's flags, seen through the `openai` client and vLLM's sleep/wake endpoints."""

import asyncio
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e.cluster.ports import free_port
from standin import cli
from standin.engine_core import ENGINE_TITLE

REPO = Path(__file__).resolve().parent.parent
# An instance's vLLM option string as a launcher would pass it, flags the stand-in ignores included.
VLLM_FLAGS = shlex.split(
    "--model /models/tiny-llama --served-model-name tiny --dtype float32 --enforce-eager "
    "--kv-cache-memory-bytes 67108864 --max-model-len 256 --enable-lora --max-lora-rank 8"
)
POLL_LIMIT_S = 20.0


async def _until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll `condition` every 50 ms; fail the test if it is not true within POLL_LIMIT_S."""
    try:
        async with asyncio.timeout(POLL_LIMIT_S):
            while True:
                if await condition():
                    return
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


@dataclass
class Standin:
    process: "subprocess.Popen[bytes]"
    url: str
    log: Path
    spawned: float

    async def wait_healthy(self) -> float:
        """Poll /health until 200; return seconds since the process was spawned."""
        async with aiohttp.ClientSession() as session:

            async def healthy() -> bool:
                assert self.process.poll() is None, self.log.read_text()
                try:
                    async with session.get(f"{self.url}/health") as response:
                        return response.status == 200
                except aiohttp.ClientConnectionError:
                    return False

            await _until(healthy, f"{self.url}/health")
        return time.monotonic() - self.spawned

    async def wait_for_log(self, text: str) -> None:
        async def logged() -> bool:
            return text in self.log.read_text()

        await _until(logged, f"{text!r} in {self.log}")

    def stop(self, timeout: float = 5.0) -> int:
        """SIGTERM, then SIGKILL if it lingers; return the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture
def start_standin(tmp_path: Path) -> Iterator[Callable[..., Standin]]:
    """Start stand-in processes on free loopback ports; every one is stopped when the test ends."""
    started: list[Standin] = []

    def start(*flags: str) -> Standin:
        port = free_port()
        log = tmp_path / f"standin-{port}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "standin", "--port", str(port), *flags],
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        started.append(Standin(process, f"http://127.0.0.1:{port}", log, time.monotonic()))
        return started[-1]

    yield start
    for standin in started:
        standin.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


async def _metric(http: aiohttp.ClientSession, url: str, name: str, **labels: str) -> float:
    async with http.get(f"{url}/metrics") as response:
        text = await response.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return sample.value
    raise AssertionError(f"{name}{labels} not in /metrics:\n{text}")


async def _until_waiting(http: aiohttp.ClientSession, url: str, count: int) -> None:
    async def waiting() -> bool:
        return await _metric(http, url, "vllm:num_requests_waiting") == count

    await _until(waiting, f"{count} waiting request(s)")


async def _sleep_state(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    return {
        state: await _metric(http, url, "vllm:engine_sleep_state", sleep_state=state)
        for state in ("awake", "weights_offloaded", "discard_all")
    }


async def test_openai_client_chats_and_streams_with_vllm_flags(start_standin: Callable[..., Standin]) -> None:
    standin = start_standin(*VLLM_FLAGS)
    await standin.wait_healthy()
    async with standin.client() as client:
        models = await client.models.list()
        assert [m.id for m in models.data] == ["tiny"]

        messages: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "Hi there"}]
        chat = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=5)
        answer = chat.choices[0].message.content
        assert answer is not None
        assert len(answer.split()) == 5
        assert chat.choices[0].finish_reason == "length"
        assert chat.usage is not None
        assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (2, 5)

        stream = await client.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == answer
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 5

        completion = await client.completions.create(model="tiny", prompt="def hello(", max_tokens=3, n=2)
        assert [c.text for c in completion.choices] == [" ".join(answer.split()[:3])] * 2

        with pytest.raises(openai.NotFoundError, match="does not exist"):
            await client.completions.create(model="other", prompt="x")


async def test_request_sent_while_asleep_is_held_then_answered_after_wake(
    start_standin: Callable[..., Standin], http: aiohttp.ClientSession
) -> None:
    standin = start_standin(*VLLM_FLAGS, "--sleep-delay", "0.2", "--wake-delay", "0.3")
    await standin.wait_healthy()
    url = standin.url
    assert await _sleep_state(http, url) == {"awake": 1, "weights_offloaded": 0, "discard_all": 0}

    started = time.monotonic()
    async with http.post(f"{url}/sleep", params={"level": "1"}) as response:
        assert (response.status, await response.json()) == (200, {"status": "sleeping", "level": 1})
    assert time.monotonic() - started >= 0.2
    async with http.get(f"{url}/is_sleeping") as response:
        assert await response.json() == {"is_sleeping": True}
    assert await _sleep_state(http, url) == {"awake": 0, "weights_offloaded": 1, "discard_all": 0}

    async with standin.client() as client:
        held = asyncio.create_task(client.completions.create(model="tiny", prompt="hello", max_tokens=2))
        await _until_waiting(http, url, 1)
        await asyncio.sleep(0.3)
        assert not held.done()

        started = time.monotonic()
        async with http.post(f"{url}/wake_up") as response:
            assert response.status == 200
            assert (await response.json())["status"] == "awake"
        assert time.monotonic() - started >= 0.3
        completion = await asyncio.wait_for(held, 5)
    assert completion.choices[0].text
    async with http.get(f"{url}/is_sleeping") as response:
        assert await response.json() == {"is_sleeping": False}
    assert await _metric(http, url, "vllm:num_requests_waiting") == 0
    assert await _sleep_state(http, url) == {"awake": 1, "weights_offloaded": 0, "discard_all": 0}


async def test_sleep_level_is_validated_and_level_2_reported(
    start_standin: Callable[..., Standin], http: aiohttp.ClientSession
) -> None:
    standin = start_standin()
    await standin.wait_healthy()
    async with http.post(f"{standin.url}/sleep", params={"level": "3"}) as response:
        assert response.status == 400
        assert (await response.json())["error"]["param"] == "query.level"
    assert (await _sleep_state(http, standin.url))["awake"] == 1
    async with http.post(f"{standin.url}/sleep", params={"level": "2"}) as response:
        assert await response.json() == {"status": "sleeping", "level": 2}
    assert await _sleep_state(http, standin.url) == {"awake": 0, "weights_offloaded": 0, "discard_all": 1}


async def test_startup_delay_keeps_the_port_closed(start_standin: Callable[..., Standin]) -> None:
    standin = start_standin("--startup-delay", "2")
    await standin.wait_for_log("listening in 2.0 s")
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as session, session.get(f"{standin.url}/health"):
            pass
    assert await standin.wait_healthy() >= 2.0


async def test_sigterm_before_listening_exits_0(start_standin: Callable[..., Standin]) -> None:
    standin = start_standin("--startup-delay", "60")
    await standin.wait_for_log("listening in 60.0 s")
    assert standin.stop(timeout=5) == 0


async def test_a_cancelled_startup_delay_ends_cancelled_and_never_listens() -> None:
    """A server cancelled while it waits out --startup-delay (its caller giving up) stops there: the
    cancellation reaches the caller, and the port never opens."""
    port = free_port()
    args, _ = cli.build_parser().parse_known_args(["--startup-delay", "60", "--no-engine-process", "--port", str(port)])
    serving = asyncio.ensure_future(cli._serve(args, None))
    await asyncio.sleep(0.05)
    serving.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(5):  # a cancel lands within a turn of the loop; 5 s only says it did not hang
            await serving
    assert serving.cancelled()
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/health"):
            pass


async def test_sigterm_exits_0_promptly_while_holding_requests(
    start_standin: Callable[..., Standin], http: aiohttp.ClientSession
) -> None:
    standin = start_standin()
    await standin.wait_healthy()
    async with http.post(f"{standin.url}/sleep") as response:
        assert response.status == 200

    async def complete() -> None:
        async with http.post(f"{standin.url}/v1/completions", json={"prompt": "hi"}) as response:
            await response.read()

    held = asyncio.create_task(complete())
    await _until_waiting(http, standin.url, 1)
    started = time.monotonic()
    assert await asyncio.to_thread(standin.stop, 60) == 0, "exited by itself, not killed after the grace period"
    # Quiet, it exits in 0.1-0.3 s; 3.9 s at a load average of 17 on 2 cores. A server that waited for its held
    # request would wait for ever, one that waited out aiohttp's graceful shutdown 60 s: 15 s tells both apart.
    assert time.monotonic() - started < 15
    with pytest.raises(aiohttp.ClientError):
        await held


def _engine_of(standin: Standin) -> psutil.Process:
    (engine,) = psutil.Process(standin.process.pid).children()
    return engine


async def _post_completion(http: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with http.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2}) as response:
        return response.status, await response.text()


async def test_an_engine_process_that_dies_leaves_its_server_up_and_wedged(
    start_standin: Callable[..., Standin], http: aiohttp.ClientSession
) -> None:
    """vLLM's bad case: /health and the rest keep answering 200, every inference request fails."""
    standin = start_standin(*VLLM_FLAGS)
    await standin.wait_healthy()
    engine = _engine_of(standin)
    assert " ".join(engine.cmdline()).startswith(ENGINE_TITLE)  # what a launcher finds it by
    assert (await _post_completion(http, standin.url))[0] == 200
    engine.kill()
    await standin.wait_for_log(f"engine process {engine.pid} died")
    status, body = await _post_completion(http, standin.url)
    assert status == 500
    assert f"EngineCore (process {engine.pid}) died" in body
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    async with http.post(f"{standin.url}/v1/chat/completions", json=chat) as response:
        assert response.status == 500
    for route in ("/health", "/v1/models", "/is_sleeping", "/metrics"):
        async with http.get(f"{standin.url}{route}") as response:
            assert response.status == 200, route
    assert standin.process.poll() is None
    assert standin.stop() == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
async def test_the_engine_process_ends_with_its_server(start_standin: Callable[..., Standin], sig: int) -> None:
    standin = start_standin()
    await standin.wait_healthy()
    engine = _engine_of(standin)
    standin.process.send_signal(sig)
    engine.wait(timeout=5)  # raises TimeoutExpired if it outlives its server
    assert standin.process.wait(5) == (0 if sig == signal.SIGTERM else -sig)


async def test_without_an_engine_process_it_generates_in_its_own(
    start_standin: Callable[..., Standin], http: aiohttp.ClientSession
) -> None:
    standin = start_standin("--served-model-name", "tiny", "--no-engine-process")
    await standin.wait_healthy()
    assert psutil.Process(standin.process.pid).children() == []
    assert (await _post_completion(http, standin.url))[0] == 200


def test_refuses_to_bind_beyond_loopback() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "standin", "--host", "0.0.0.0", "--port", str(free_port())],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "loopback addresses only" in result.stderr


async def test_token_ids_logprobs_and_a_wake_that_corrupts_on_purpose(
    start_standin: Callable[..., Standin], http: aiohttp.ClientSession
) -> None:
    """vLLM's `return_token_ids`, `logprobs` and `return_tokens_as_token_ids`; from the 2nd wake on other tokens."""
    standin = start_standin("--corrupt-after-wake", "2")
    await standin.wait_healthy()
    probe = {"prompt": [7, 8, 9], "max_tokens": 3, "temperature": 0, "return_token_ids": True, "logprobs": 2,
             "return_tokens_as_token_ids": True}  # fmt: skip

    async def answer() -> dict[str, Any]:
        async with http.post(f"{standin.url}/v1/completions", json=probe) as response:
            assert response.status == 200
            choice: dict[str, Any] = (await response.json())["choices"][0]
            return choice

    first = await answer()
    assert (first["prompt_token_ids"], len(first["token_ids"])) == ([7, 8, 9], 3)
    logprobs = first["logprobs"]
    assert logprobs["tokens"] == [f"token_id:{t}" for t in first["token_ids"]]
    assert [len(top) for top in logprobs["top_logprobs"]] == [2, 2, 2]
    for wakes, same in ((1, True), (2, False)):
        for route in ("/sleep", "/wake_up"):
            async with http.post(f"{standin.url}{route}") as response:
                assert response.status == 200
        assert ((await answer())["token_ids"] == first["token_ids"]) is same, f"after wake {wakes}"
