"""The transformers runtime as clients see it: one real server process on the tiny model, driven through
the `openai` client and vLLM's sleep/wake and LoRA endpoints.

The server is shared by the module (starting one costs seconds of imports), so each test leaves it
awake and with only its static adapter.
"""

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tokenizers import Tokenizer

from e2e.cluster.ports import free_port
from e2e.launcher_process import REPO, offline_environment, wait_healthy
from e2e.tiny_lora import ensure_tiny_lora

START_TIMEOUT_S = 120.0
MAX_MODEL_LEN = 96
MAX_WAITING = 8
MAX_NUM_SEQS = 4
SLEEP_WAIT_TIMEOUT_S = 2.0
PROMPTS = ("def hello(world):", "import os\n", "class Tree:", "for i in range(")
# An instance's vLLM options as the launcher passes them, with flags this runtime ignores.
VLLM_ONLY_FLAGS = ["--enforce-eager", "--kv-cache-memory-bytes", "67108864", "--max-lora-rank", "8"]


@dataclass
class Server:
    process: "subprocess.Popen[bytes]"
    url: str
    log: Path
    model: Path

    def client(self) -> openai.AsyncOpenAI:
        """A request that waits for a batch takes seconds quiet, but 31.8 s and more on two busy cores (issue 47):
        120 s tells a hung server from a busy one."""
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=120)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


@pytest.fixture(scope="module")
def server(model_a: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("transformers-runtime")
    port = free_port()
    lora = ensure_tiny_lora(base_seed=1, seed=0)
    flags = [
        *("--model", str(model_a), "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port)),
        *("--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32", "--lora-modules", f"static={lora}"),
        *("--max-waiting-requests", str(MAX_WAITING), "--sleep-wait-timeout", str(SLEEP_WAIT_TIMEOUT_S)),
        *("--max-num-seqs", str(MAX_NUM_SEQS)),
        *VLLM_ONLY_FLAGS,
    ]
    log = work / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "transformers_runtime", *flags],
            cwd=REPO,
            env=offline_environment(work),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    running = Server(process, f"http://127.0.0.1:{port}", log, model_a)
    try:
        wait_healthy(f"{running.url}/health", lambda: running.process.poll() is None, START_TIMEOUT_S,
                     running.log.read_text)  # fmt: skip
        yield running
    finally:
        running.stop()


@pytest.fixture
async def client(server: Server) -> AsyncIterator[openai.AsyncOpenAI]:
    async with server.client() as client:
        yield client


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


async def _greedy(client: openai.AsyncOpenAI, prompt: str = PROMPTS[0], model: str = "tiny", tokens: int = 12) -> str:
    completion = await client.completions.create(model=model, prompt=prompt, max_tokens=tokens, temperature=0)
    return completion.choices[0].text


async def _metrics(http: aiohttp.ClientSession, server: Server) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    async with http.get(f"{server.url}/metrics") as response:
        assert response.status == 200
        text = await response.text()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def _metric(http: aiohttp.ClientSession, server: Server, name: str, **labels: str) -> float:
    values = [v for (n, ls), v in (await _metrics(http, server)).items() if n == name and labels.items() <= ls]
    assert len(values) == 1, f"{name}{labels}: {values}"
    return values[0]


async def _until(condition: Callable[[], Awaitable[bool]], what: str, limit_s: float = 10.0) -> None:
    try:
        async with asyncio.timeout(limit_s):
            while True:
                if await condition():
                    return
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def _waiting(http: aiohttp.ClientSession, server: Server, count: int) -> None:
    async def reached() -> bool:
        return await _metric(http, server, "vllm:num_requests_waiting") == count

    await _until(reached, f"{count} waiting request(s)")


async def _post(http: aiohttp.ClientSession, server: Server, path: str, **params: str) -> tuple[int, object]:
    async with http.post(f"{server.url}{path}", params=params) as response:
        return response.status, await response.json()


async def _is_sleeping(http: aiohttp.ClientSession, server: Server) -> bool:
    async with http.get(f"{server.url}/is_sleeping") as response:
        body = await response.json()
    sleeping: bool = body["is_sleeping"]
    return sleeping


def _prompt_tokens(server: Server, prompt: str) -> int:
    return len(Tokenizer.from_file(str(server.model / "tokenizer.json")).encode(prompt).ids)


# Models, completions, chat -------------------------------------------------------------------------


async def test_models_list_the_base_and_the_static_adapter_and_vllm_flags_are_ignored(
    server: Server, client: openai.AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    models = (await client.models.list()).data
    assert [m.id for m in models] == ["tiny", "static"]
    assert models[1].model_extra is not None
    assert models[1].model_extra["parent"] == "tiny"
    for path in ("/health", "/healthz"):
        async with http.get(f"{server.url}{path}") as response:
            assert response.status == 200
    assert "ignoring flags the transformers runtime does not use: " + " ".join(VLLM_ONLY_FLAGS) in (
        server.log.read_text()
    )


async def test_greedy_completion_is_deterministic_and_counts_usage(server: Server, client: openai.AsyncOpenAI) -> None:
    first = await client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=10, temperature=0)
    second = await client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=10, temperature=0)
    assert first.choices[0].text
    assert first.choices[0].text == second.choices[0].text
    assert first.choices[0].finish_reason == "length"
    assert first.usage is not None
    prompt_tokens = _prompt_tokens(server, PROMPTS[0])
    assert (first.usage.prompt_tokens, first.usage.completion_tokens) == (prompt_tokens, 10)
    assert first.usage.total_tokens == prompt_tokens + 10
    with_ids = await client.completions.create(
        model="tiny", prompt=PROMPTS[0], max_tokens=10, temperature=0, extra_body={"return_token_ids": True}
    )
    choice = with_ids.choices[0].model_dump()  # vLLM's fields: the prompt's token IDs and the answer's
    assert len(choice["prompt_token_ids"]) == prompt_tokens
    assert len(choice["token_ids"]) == 10
    replayed = await client.completions.create(
        model="tiny",
        prompt=choice["prompt_token_ids"],
        max_tokens=10,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    assert (replayed.choices[0].text, replayed.choices[0].model_dump()["token_ids"]) == (
        first.choices[0].text,
        choice["token_ids"],
    )


async def test_seeded_sampling_repeats_and_n_gives_n_choices(client: openai.AsyncOpenAI) -> None:
    async def sampled(seed: int) -> list[str]:
        completion = await client.completions.create(
            model="tiny", prompt=PROMPTS[1], max_tokens=8, temperature=1.0, top_p=0.95, n=3, seed=seed
        )
        assert [c.index for c in completion.choices] == [0, 1, 2]
        assert completion.usage is not None
        assert completion.usage.completion_tokens == 24
        return [c.text for c in completion.choices]

    seven = await sampled(7)
    assert await sampled(7) == seven
    assert await sampled(8) != seven
    assert len(set(seven)) > 1  # n sequences, not n copies


async def test_stop_sequences_end_the_text_before_them(client: openai.AsyncOpenAI) -> None:
    text = await _greedy(client, tokens=16)
    stop = text[6:9]
    assert len(stop) == 3
    expected = text[: text.index(stop)]
    for stops in (stop, ["never-generated", stop]):
        completion = await client.completions.create(
            model="tiny", prompt=PROMPTS[0], max_tokens=16, temperature=0, stop=stops
        )
        assert (completion.choices[0].text, completion.choices[0].finish_reason) == (expected, "stop")
    stream = await client.completions.create(
        model="tiny", prompt=PROMPTS[0], max_tokens=16, temperature=0, stop=stop, stream=True
    )
    assert "".join([chunk.choices[0].text async for chunk in stream if chunk.choices]) == expected


async def test_a_streamed_completion_is_the_whole_one_in_pieces_ending_with_done(
    server: Server, client: openai.AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    whole = await _greedy(client)
    stream = await client.completions.create(
        model="tiny",
        prompt=PROMPTS[0],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    pieces = [c.choices[0].text for c in chunks if c.choices]
    assert len(pieces) > 1
    assert "".join(pieces) == whole
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12

    body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 3, "stream": True}
    async with http.post(f"{server.url}/v1/completions", json=body) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        events = [line for line in (await response.text()).split("\n\n") if line]
    assert all(event.startswith("data: ") for event in events)
    assert events[-1] == "data: [DONE]"


async def test_chat_uses_the_template_and_streams_the_same_answer(client: openai.AsyncOpenAI) -> None:
    messages: list[openai.types.chat.ChatCompletionMessageParam] = [
        {"role": "system", "content": "You write Python."},
        {"role": "user", "content": "A tree class, please."},
    ]
    chat = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0)
    answer = chat.choices[0].message.content
    assert answer
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage is not None
    assert chat.usage.prompt_tokens > 10
    again = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0)
    assert again.choices[0].message.content == answer
    stream = await client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=10, temperature=0, stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == answer
    assert chunks[-1].choices[0].finish_reason == "length"


async def test_client_errors_are_openai_errors_with_vllms_statuses(
    server: Server, client: openai.AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    with pytest.raises(openai.NotFoundError, match="The model `nope` does not exist"):
        await client.completions.create(model="nope", prompt="x")
    with pytest.raises(openai.BadRequestError, match=f"maximum context length is {MAX_MODEL_LEN} tokens"):
        await client.completions.create(model="tiny", prompt="word " * 200)
    with pytest.raises(openai.BadRequestError, match=r"temperature must be in \[0, 2\], got 3.0"):
        await client.completions.create(model="tiny", prompt="x", temperature=3)
    with pytest.raises(openai.BadRequestError, match="n must be 1 when using greedy sampling"):
        await client.completions.create(model="tiny", prompt="x", temperature=0, n=2)
    with pytest.raises(openai.BadRequestError, match=rf"n must be at most {MAX_NUM_SEQS} \(--max-num-seqs\)"):
        await client.completions.create(model="tiny", prompt="x", n=1000)
    with pytest.raises(openai.BadRequestError, match="echo is not supported"):
        await client.completions.create(model="tiny", prompt="x", echo=True)
    async with http.post(f"{server.url}/v1/completions", data=b"{not json") as response:
        assert response.status == 400
        error = (await response.json())["error"]
    assert error.keys() == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == ("BadRequestError", 400)


async def test_sampling_parameters_take_effect(server: Server, client: openai.AsyncOpenAI) -> None:
    greedy = await _greedy(client, PROMPTS[1], tokens=12)
    top_1 = await client.completions.create(
        model="tiny", prompt=PROMPTS[1], max_tokens=12, temperature=1.0, extra_body={"top_k": 1}
    )
    assert top_1.choices[0].text == greedy
    penalised = await client.completions.create(
        model="tiny", prompt=PROMPTS[1], max_tokens=12, temperature=0, presence_penalty=2.0, frequency_penalty=1.0
    )
    assert penalised.choices[0].text != greedy
    token = Tokenizer.from_file(str(server.model / "tokenizer.json")).encode("import").ids[-1]
    forced = await client.completions.create(
        model="tiny",
        prompt=PROMPTS[1],
        max_tokens=12,
        temperature=0,
        logit_bias={str(token): 100},
        extra_body={"stop_token_ids": [token]},
    )
    choice = forced.choices[0]
    assert (choice.text, choice.finish_reason, choice.model_dump()["stop_reason"]) == ("", "stop", token)
    assert forced.usage is not None
    assert forced.usage.completion_tokens == 1


async def test_logprobs_are_the_models_and_streams_carry_the_same(client: openai.AsyncOpenAI) -> None:
    """Greedy: each token is the most likely, so its logprob heads the top ones; streamed, the same entries."""
    whole = await client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=8, temperature=0, logprobs=2)
    logprobs = whole.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.tokens is not None
    assert logprobs.token_logprobs is not None
    assert logprobs.top_logprobs is not None
    assert len(logprobs.tokens) == 8
    for token, logprob, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert logprob < 0
        assert 1 <= len(top) <= 2
        assert top[token] == logprob == max(top.values())
    lengths = [len(token) for token in logprobs.tokens]
    assert logprobs.text_offset == [sum(lengths[:i]) for i in range(8)]
    stream = await client.completions.create(
        model="tiny", prompt=PROMPTS[0], max_tokens=8, temperature=0, logprobs=2, stream=True
    )
    pieces = [chunk.choices[0].logprobs async for chunk in stream if chunk.choices and chunk.choices[0].logprobs]
    assert [token for piece in pieces for token in piece.tokens or []] == logprobs.tokens
    assert [offset for piece in pieces for offset in piece.text_offset or []] == logprobs.text_offset

    as_ids = await client.completions.create(
        model="tiny",
        prompt=PROMPTS[0],
        max_tokens=8,
        temperature=0,
        logprobs=1,
        extra_body={"return_tokens_as_token_ids": True, "return_token_ids": True},
    )
    named = as_ids.choices[0].logprobs
    assert named is not None
    assert named.tokens == [f"token_id:{token}" for token in as_ids.choices[0].model_dump()["token_ids"]]
    assert named.token_logprobs == logprobs.token_logprobs

    messages: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": PROMPTS[3]}]
    chat = await client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    assert chat.choices[0].logprobs is not None
    content = chat.choices[0].logprobs.content
    assert content is not None
    assert len(content) == 6
    for entry in content:
        assert [top.logprob for top in entry.top_logprobs] == sorted(
            (t.logprob for t in entry.top_logprobs), reverse=True
        )
        assert (entry.top_logprobs[0].token, entry.top_logprobs[0].logprob) == (entry.token, entry.logprob)
        assert entry.bytes == list(entry.token.encode())
    plain = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0)
    assert plain.choices[0].logprobs is None
    assert plain.choices[0].message.content == chat.choices[0].message.content


Refusal = tuple[dict[str, object], str, str]  # fields, the param the 400 names, words of its message
REFUSED: list[Refusal] = [
    ({"top_k": -2}, "top_k", "top_k must be -1 (disable), or at least 1, got -2"),
    ({"min_p": 1.5}, "min_p", "min_p must be in [0, 1]"),
    ({"presence_penalty": 2.5}, "presence_penalty", "presence_penalty must be in [-2, 2]"),
    ({"frequency_penalty": -3.0}, "frequency_penalty", "frequency_penalty must be in [-2, 2]"),
    ({"repetition_penalty": 0.0}, "repetition_penalty", "repetition_penalty must be greater than zero"),
    ({"logit_bias": {"abc": 1.0}}, "logit_bias", "logit_bias keys must be token ids"),
    ({"logit_bias": {"99999": 1.0}}, "logit_bias", "token id 99999 is out of vocabulary"),
    ({"logit_bias": {"5": 101.0}}, "logit_bias", "logit_bias values must be in [-100, 100]"),
    ({"stop_token_ids": [-1]}, "stop_token_ids", "token id -1 is out of vocabulary"),
    ({"logprobs": 21}, "logprobs", "logprobs must be in [0, 20], got 21"),
    ({"echo": True}, "echo", "echo is not supported"),
    ({"min_tokens": 4}, "min_tokens", "min_tokens is not supported"),
    ({"use_beam_search": True}, "use_beam_search", "use_beam_search is not supported"),
    ({"guided_regex": "a+"}, "guided_regex", "guided_regex is not supported"),
]
REFUSED_IN_CHAT: list[Refusal] = [
    ({"top_logprobs": 3}, "top_logprobs", "when using top_logprobs, logprobs must be set to true"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "top_logprobs must be in [0, 20], got 21"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "tools is not supported"),
    ({"tool_choice": "required"}, "tool_choice", "tool_choice is not supported"),
    ({"response_format": {"type": "json_object"}}, "response_format", "response_format is not supported"),
]


async def test_parameters_out_of_range_or_not_implemented_are_a_400_naming_them(
    server: Server, http: aiohttp.ClientSession
) -> None:
    neutral = {"top_logprobs": 0, "tool_choice": "auto", "tools": [], "top_k": -1, "min_tokens": 0, "echo": False}
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    calls: list[tuple[str, dict[str, object], list[Refusal]]] = [
        ("/v1/completions", {"prompt": "x", "max_tokens": 2}, REFUSED),
        ("/v1/chat/completions", chat, REFUSED_IN_CHAT),
    ]
    for path, base, refused in calls:
        for fields, param, words in refused:
            async with http.post(f"{server.url}{path}", json=base | fields) as response:
                error = (await response.json())["error"]
                assert (response.status, error["param"]) == (400, param), (fields, error)
                assert words in error["message"], error
        async with http.post(f"{server.url}{path}", json=base | neutral) as response:
            assert response.status == 200, await response.text()


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("/v1/completions", b"[" * 100_000 + b"]" * 100_000, 400, "JSON decode error"),
        ("/v1/completions", b'{"prompt": "\xff\xfe"}', 400, "JSON decode error"),
        ("/v1/completions", b" " * (10 * 1024 * 1024), 413, "Maximum request body size"),
        ("/v1/completions", b'{"prompt": "x", "seed": 18446744073709551616}', 400, "seed: Input should be less"),
        ("/v1/completions", b'{"prompt": ["a", "b", "c"], "n": 2}', 400, "3 prompts x n=2 are 6 sequences"),
        ("/v1/completions", b'{"prompt": "x", "top_p": NaN}', 400, "top_p must be in (0, 1], got nan"),
        ("/v1/completions", b'{"prompt": "x", "max_tokens": -1}', 400, "max_tokens must be at least 1, got -1"),
        ("/v1/completions", b'"just a string"', 400, "Input should be a valid dictionary"),
        ("/v1/chat/completions", b'{"messages": []}', 400, "messages: List should have at least 1 item"),
        ("/v1/load_lora_adapter", b'{"lora_name": "a", "lora_path": "/tmp/x\\u0000y"}', 400, "NUL"),
        ("/v1/load_lora_adapter", b'{"lora_name": "a", "lora_path": "' + b"d/" * 3000 + b'"}', 400, "lora_path"),
        ("/v1/nope", b"{}", 404, "POST /v1/nope"),
        ("/health", b"{}", 405, "POST /health"),
    ],
)
async def test_bad_input_is_a_400_naming_it_before_anything_runs(
    server: Server, http: aiohttp.ClientSession, path: str, body: bytes, status: int, words: str
) -> None:
    async with http.post(f"{server.url}{path}", data=body, headers={"Content-Type": "application/json"}) as response:
        assert response.status == status
        error = (await response.json())["error"]
    assert words in error["message"], error
    async with server.client() as client:
        assert await _greedy(client), "the server still serves"


async def test_shell_metacharacters_in_a_lora_path_run_nothing(
    server: Server, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    canary = tmp_path / "ran"
    for path in (f"$(touch {canary})", f"`touch {canary}`", f"x; touch {canary}", f"x | touch {canary}"):
        async with http.post(f"{server.url}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": path}) as got:
            assert got.status == 404, await got.text()
    assert not canary.exists()


async def test_openapi_document_and_docs_page_describe_every_route(server: Server, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{server.url}/openapi.json") as response:
        document = await response.json()
    assert document["openapi"] == "3.1.0"
    assert set(document["paths"]) == {
        "/health", "/healthz", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions", "/sleep",
        "/wake_up", "/is_sleeping", "/v1/load_lora_adapter", "/v1/unload_lora_adapter",
    }  # fmt: skip
    completions = document["paths"]["/v1/completions"]["post"]
    assert completions["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/CompletionRequest"
    }
    assert document["components"]["schemas"]["CompletionRequest"]["properties"]["seed"]["anyOf"][0]["maximum"] == (
        2**64 - 1
    )
    assert [p["name"] for p in document["paths"]["/sleep"]["post"]["parameters"]] == ["level", "mode"]
    async with http.get(f"{server.url}/docs") as response:
        assert response.content_type == "text/html"
        assert "<code>/v1/chat/completions</code>" in await response.text()


# Sleep and wake ------------------------------------------------------------------------------------


async def test_level_1_holds_a_request_until_wake_and_answers_as_before(
    server: Server, client: openai.AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    before = await _greedy(client)
    assert await _post(http, server, "/sleep", level="1") == (200, {"status": "sleeping", "level": 1})
    assert await _is_sleeping(http, server)
    async with http.get(f"{server.url}/health") as response:
        assert response.status == 200  # alive while asleep, as vLLM
    assert await _metric(http, server, "vllm:engine_sleep_state", sleep_state="weights_offloaded") == 1

    held = asyncio.create_task(_greedy(client))
    await _waiting(http, server, 1)
    await asyncio.sleep(0.3)
    assert not held.done()
    assert await _post(http, server, "/wake_up") == (200, {"status": "awake", "tags": None})
    assert await asyncio.wait_for(held, 10) == before
    assert not await _is_sleeping(http, server)
    assert await _metric(http, server, "vllm:engine_sleep_state", sleep_state="awake") == 1


async def test_level_2_reloads_from_disk_once_every_tag_is_awake(
    server: Server, client: openai.AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    before = await _greedy(client)
    assert await _post(http, server, "/sleep", level="2", mode="wait") == (200, {"status": "sleeping", "level": 2})
    assert await _metric(http, server, "dualpods_runtime_sleep_level") == 2
    status, body = await _post(http, server, "/wake_up", tags="weights")
    assert (status, body) == (200, {"status": "sleeping", "tags": ["weights"]})
    assert await _is_sleeping(http, server)
    assert await _post(http, server, "/wake_up", tags="kv_cache") == (200, {"status": "awake", "tags": ["kv_cache"]})
    assert await _greedy(client) == before
    assert await _metric(http, server, "dualpods_runtime_model_load_seconds") > 0
    for bad, param in ({"level": "3"}, "query.level"), ({"mode": "keep"}, "query.mode"):
        status, body = await _post(http, server, "/sleep", **bad)
        assert status == 400
        assert isinstance(body, dict)
        assert body["error"]["param"] == param
    assert not await _is_sleeping(http, server)


async def test_a_full_queue_answers_429_and_a_long_sleep_503(
    server: Server, client: openai.AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    assert (await _post(http, server, "/sleep", level="0"))[0] == 200
    requests = [asyncio.create_task(_greedy(client, tokens=2)) for _ in range(MAX_WAITING + 2)]
    await _waiting(http, server, MAX_WAITING)

    async def two_refused() -> bool:  # the two over the limit are refused at once
        return sum(r.done() for r in requests) == 2

    await _until(two_refused, "two refusals")
    assert (await _post(http, server, "/wake_up"))[0] == 200
    outcomes = await asyncio.gather(*requests, return_exceptions=True)
    refused = [o for o in outcomes if isinstance(o, openai.RateLimitError)]
    assert len(refused) == 2
    assert refused[0].response.headers["Retry-After"] == "1"
    assert sum(isinstance(o, str) for o in outcomes) == MAX_WAITING

    assert (await _post(http, server, "/sleep", level="1"))[0] == 200
    started = time.monotonic()
    with pytest.raises(openai.InternalServerError, match="not woken within") as late:
        await _greedy(client)
    assert late.value.status_code == 503
    assert SLEEP_WAIT_TIMEOUT_S <= time.monotonic() - started < SLEEP_WAIT_TIMEOUT_S + 3
    assert (await _post(http, server, "/wake_up"))[0] == 200


# Concurrency, LoRA, metrics ------------------------------------------------------------------------


@dataclass(frozen=True)
class Ask:
    """One greedy request of the concurrency tests: what it asks and how it is answered."""

    prompt: str
    tokens: int
    model: str = "tiny"
    stream: bool = False
    chat: bool = False


async def _answer(client: openai.AsyncOpenAI, ask: Ask) -> tuple[str, str | None, int]:
    """The text, finish reason and completion tokens of `ask` (a stream asks for its usage, too)."""
    usage: openai.types.chat.ChatCompletionStreamOptionsParam | None = {"include_usage": True} if ask.stream else None
    if ask.chat:
        messages: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": ask.prompt}]
        chat = await client.chat.completions.create(
            model=ask.model,
            messages=messages,
            max_tokens=ask.tokens,
            temperature=0,
            stream=ask.stream,
            stream_options=usage,
        )
        if isinstance(chat, openai.AsyncStream):
            chunks = [chunk async for chunk in chat]
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            end = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
            assert chunks[-1].usage is not None
            return text, end, chunks[-1].usage.completion_tokens
        assert chat.usage is not None
        return chat.choices[0].message.content or "", chat.choices[0].finish_reason, chat.usage.completion_tokens
    completion = await client.completions.create(
        model=ask.model,
        prompt=ask.prompt,
        max_tokens=ask.tokens,
        temperature=0,
        stream=ask.stream,
        stream_options=usage,
    )
    if isinstance(completion, openai.AsyncStream):
        pieces = [chunk async for chunk in completion]
        assert pieces[-1].usage is not None
        text = "".join(p.choices[0].text for p in pieces if p.choices)
        end = [p.choices[0].finish_reason for p in pieces if p.choices][-1]
        return text, end, pieces[-1].usage.completion_tokens
    assert completion.usage is not None
    return completion.choices[0].text, completion.choices[0].finish_reason, completion.usage.completion_tokens


ASKS = [
    Ask(PROMPTS[0], 12),
    Ask("x", 30, stream=True),
    Ask(PROMPTS[1] * 6, 5),
    Ask(PROMPTS[2], 20, model="static"),
    Ask(PROMPTS[3], 16, chat=True, stream=True),
    Ask(PROMPTS[2] + PROMPTS[0], 9, stream=True),
    Ask(PROMPTS[0], 24, model="static", stream=True),
    Ask(PROMPTS[1], 40, chat=True),
]


async def test_concurrent_greedy_answers_are_token_for_token_the_sequential_ones(
    server: Server, client: openai.AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    """Different prompt lengths and max_tokens, streamed or not, chat or not, two adapters: batching changes nothing."""
    alone = [await _answer(client, ask) for ask in ASKS]
    assert {end for _, end, _ in alone} == {"length"}
    before = await _metrics(http, server)
    together = await asyncio.gather(*(_answer(client, ask) for ask in ASKS))  # as many as may wait: no 429
    after = await _metrics(http, server)
    assert together == alone
    labels = frozenset({"model_name": "tiny", "engine": "0"}.items())
    generated = after[("vllm:generation_tokens_total", labels)] - before[("vllm:generation_tokens_total", labels)]
    assert generated == sum(tokens for _, _, tokens in alone)


async def test_requests_beyond_max_num_seqs_wait_for_room_in_the_batch(
    server: Server, client: openai.AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    """Held at the door while asleep, then let in at once: MAX_NUM_SEQS run as one batch, the rest wait their turn.
    Each of the last two waits at the door, then for the whole batch, then generates: on a CI machine's two busy
    cores that took 31.8 s once, so these requests may wait two minutes (as the shared client's all may)."""
    ask = Ask(PROMPTS[0], 60)
    expected = await _answer(client, ask)
    assert (await _post(http, server, "/sleep", level="0"))[0] == 200
    requests = [asyncio.create_task(_answer(client, ask)) for _ in range(MAX_NUM_SEQS + 2)]
    await _waiting(http, server, MAX_NUM_SEQS + 2)
    assert (await _post(http, server, "/wake_up"))[0] == 200

    async def one_full_batch() -> bool:
        metrics = await _metrics(http, server)
        labels = frozenset({"model_name": "tiny", "engine": "0"}.items())
        running, waiting = (metrics[(f"vllm:num_requests_{what}", labels)] for what in ("running", "waiting"))
        return (running, waiting) == (MAX_NUM_SEQS, 2)

    await _until(one_full_batch, f"{MAX_NUM_SEQS} running and 2 waiting")
    assert await asyncio.gather(*requests) == [expected] * (MAX_NUM_SEQS + 2)


async def test_sleep_aborts_a_running_batch_and_the_wake_serves_the_same_answers(
    server: Server, client: openai.AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    ask = Ask(PROMPTS[0], MAX_MODEL_LEN - 8, stream=True)
    expected, end, _ = await _answer(client, ask)
    assert end == "length"
    streams = [asyncio.create_task(_answer(client, ask)) for _ in range(3)]

    async def batched() -> bool:
        return await _metric(http, server, "vllm:num_requests_running") == 3

    await _until(batched, "3 requests in one batch")
    assert (await _post(http, server, "/sleep", level="1"))[0] == 200
    for text, end, tokens in await asyncio.gather(*streams):
        assert end == "abort"
        assert expected.startswith(text)
        assert tokens < ask.tokens
    assert (await _post(http, server, "/wake_up"))[0] == 200
    assert (await _answer(client, ask))[0] == expected


async def test_lora_adapters_change_the_output_and_load_and_unload_at_runtime(
    server: Server, client: openai.AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    base, static = await _greedy(client), await _greedy(client, model="static")
    assert static != base

    runtime_lora = ensure_tiny_lora(base_seed=1, seed=1)
    load = {"lora_name": "runtime", "lora_path": str(runtime_lora)}
    async with http.post(f"{server.url}/v1/load_lora_adapter", json=load) as response:
        assert (response.status, await response.text()) == (200, "Success: LoRA adapter 'runtime' added successfully.")
    assert [m.id for m in (await client.models.list()).data] == ["tiny", "static", "runtime"]
    runtime = await _greedy(client, model="runtime")
    assert runtime not in (base, static)
    assert await _greedy(client, model="static") == static  # switching back and forth is exact

    async with http.post(f"{server.url}/v1/load_lora_adapter", json=load) as response:
        assert response.status == 400
        assert "has already been loaded" in (await response.json())["error"]["message"]
    missing = {"lora_name": "missing", "lora_path": str(server.model / "no-such-adapter")}
    async with http.post(f"{server.url}/v1/load_lora_adapter", json=missing) as response:
        assert response.status == 404
        assert "No adapter found for" in (await response.json())["error"]["message"]

    unload = {"lora_name": "runtime"}
    async with http.post(f"{server.url}/v1/unload_lora_adapter", json=unload) as response:
        assert (response.status, await response.text()) == (
            200,
            "Success: LoRA adapter 'runtime' removed successfully.",
        )
    async with http.post(f"{server.url}/v1/unload_lora_adapter", json=unload) as response:
        assert response.status == 404
    with pytest.raises(openai.NotFoundError):
        await _greedy(client, model="runtime")
    assert await _greedy(client) == base


async def test_metrics_count_requests_tokens_and_adapters(server: Server, http: aiohttp.ClientSession) -> None:
    before = await _metrics(http, server)
    async with http.post(f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 3}) as response:
        assert response.status == 200
    async with http.post(f"{server.url}/v1/completions", json={"model": "nope", "prompt": "x"}) as response:
        assert response.status == 404
    after = await _metrics(http, server)

    def moved(name: str, **labels: str) -> float:
        key = (name, frozenset(labels.items()))
        return after[key] - before.get(key, 0.0)

    route = {"route": "/v1/completions", "method": "POST"}
    assert moved("dualpods_runtime_http_requests_total", **route, code="200") == 1
    assert moved("dualpods_runtime_http_requests_total", **route, code="404") == 1
    assert moved("dualpods_runtime_http_request_duration_seconds_count", **route) == 2
    labels = {"model_name": "tiny", "engine": "0"}
    assert moved("vllm:prompt_tokens_total", **labels) == _prompt_tokens(server, "x")
    assert moved("vllm:generation_tokens_total", **labels) == 3
    assert after[("vllm:num_requests_running", frozenset(labels.items()))] == 0
    assert after[("dualpods_runtime_lora_adapters", frozenset())] == 1


def test_sigterm_stops_the_server_with_status_0(server: Server) -> None:
    """Last in the module: it ends the shared server."""
    assert server.stop() == 0
    log = server.log.read_text()
    assert "shutting down" in log, log
    assert "Traceback" not in log, log
