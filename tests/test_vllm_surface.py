"""vLLM's HTTP surface over a scripted engine: what the surface checks and answers itself, whichever runtime is
behind it (the runtimes' own tests drive it end to end through the stand-in and the transformers runtime)."""

from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from api.openai_errors import ApiError
from api.vllm_surface.app import create_app
from api.vllm_surface.bodies import ModelCard, SleepMode
from api.vllm_surface.engine import Chunk, JsonObject
from api.vllm_surface.gauges import export_engine_gauges
from e2e.cluster.ports import free_port

HOST = "127.0.0.1"


@dataclass
class ScriptedAnswer:
    stream: bool
    failure: ApiError | None = None

    async def whole(self) -> JsonObject:
        return {"text": "whole"}

    async def chunks(self) -> AsyncIterator[Chunk]:
        yield {"text": "first"}
        if self.failure is not None:
            raise self.failure


@dataclass
class ScriptedEngine:
    """Records what the surface hands it; fails a stream after its first chunk when told to."""

    failure: ApiError | None = None
    calls: list[tuple[str, object]] = field(default_factory=list)
    level: int | None = None
    metrics_registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        export_engine_gauges(self.metrics_registry, "m", lambda: 0, lambda: 0, lambda: self.level)

    @property
    def is_sleeping(self) -> bool:
        return self.level is not None

    def models(self) -> list[ModelCard]:
        return [ModelCard(id="m", root="/models/m", max_model_len=64)]

    @asynccontextmanager
    async def answer(self, body: object, chat: bool) -> AsyncIterator[ScriptedAnswer]:
        self.calls.append(("chat" if chat else "completion", body))
        yield ScriptedAnswer(isinstance(body, dict) and body.get("stream") is True, self.failure)
        self.calls.append(("closed", chat))

    async def sleep(self, level: int, mode: SleepMode) -> None:
        self.calls.append(("sleep", (level, mode)))
        self.level = level

    async def wake_up(self, tags: Collection[str] | None) -> bool:
        self.calls.append(("wake", tags))
        self.level = None
        return True


@asynccontextmanager
async def served(engine: ScriptedEngine) -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    runner = web.AppRunner(create_app(engine), shutdown_timeout=0.5)
    await runner.setup()
    port = free_port()
    try:
        await web.TCPSite(runner, HOST, port).start()
        async with aiohttp.ClientSession() as session:
            yield session, f"http://{HOST}:{port}"
    finally:
        await runner.cleanup()


async def test_the_surface_checks_its_own_inputs_before_the_engine_sees_them() -> None:
    engine = ScriptedEngine()
    async with served(engine) as (http, url):
        refused = [
            ("/sleep?level=3", 400, "query.level"),
            ("/sleep?mode=keep", 400, "query.mode"),
            ("/wake_up?tags=weights&tags=gpu", 400, "query.tags"),
            ("/v1/load_lora_adapter", 404, None),  # no adapters: LoRA is not enabled
            ("/v1/nope", 404, None),
        ]
        for path, status, param in refused:
            async with http.post(f"{url}{path}") as response:
                assert response.status == status, path
                assert (await response.json())["error"]["param"] == param, path
        async with http.post(f"{url}/v1/completions", data=b"{not json") as response:
            assert response.status == 400
            assert "JSON decode error" in (await response.json())["error"]["message"]
        assert engine.calls == []
        async with http.post(f"{url}/sleep", params={"level": "2", "mode": "wait"}) as response:
            assert await response.json() == {"status": "sleeping", "level": 2}
        async with http.get(f"{url}/is_sleeping") as response:
            assert await response.json() == {"is_sleeping": True}
        async with http.post(f"{url}/wake_up", params={"tags": "weights"}) as response:
            assert await response.json() == {"status": "awake", "tags": ["weights"]}
        assert engine.calls == [("sleep", (2, "wait")), ("wake", ["weights"])]


async def test_answers_whole_or_streamed_and_a_late_failure_is_the_last_event() -> None:
    engine = ScriptedEngine(failure=ApiError(500, "the model failed", err_type="InternalServerError"))
    async with served(engine) as (http, url):
        async with http.post(f"{url}/v1/completions", json={"prompt": "x"}) as response:
            assert await response.json() == {"text": "whole"}
        async with http.post(f"{url}/v1/chat/completions", json={"stream": True}) as response:
            assert response.status == 200
            events = (await response.text()).split("\n\n")
        assert events[:3] == [
            'data: {"text": "first"}',
            'data: {"error": {"message": "the model failed", "type": "InternalServerError", "param": null, '
            '"code": 500}}',
            "data: [DONE]",
        ]
        assert [call[0] for call in engine.calls] == ["completion", "closed", "chat", "closed"]
        async with http.get(f"{url}/v1/models") as response:
            assert [card["id"] for card in (await response.json())["data"]] == ["m"]
        async with http.get(f"{url}/metrics") as response:
            assert 'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 1.0' in await response.text()


@pytest.mark.parametrize("path", ["/health", "/healthz"])
async def test_health_answers_while_asleep(path: str) -> None:
    engine = ScriptedEngine(level=1)
    async with served(engine) as (http, url), http.get(f"{url}{path}") as response:
        assert response.status == 200
