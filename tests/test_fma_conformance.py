"""Conformance of the launcher's HTTP API to FMA 0.6.4's launcher, case by case, over HTTP alone.

Each case names what of FMA it checks: a test of FMA's `inference_server/launcher/tests/test_launcher.py`
(`Class::test_name`) in the form a client observes it, or, prefixed `launcher.py:`, a behaviour of FMA's
launcher read from its code (FastAPI's validation, the index, `gpu_uuids: []`, ...). Every case runs
against both faces of the launcher: dualpods' API (FMA's plus additions) and the FMA-only mode
(`--fma-only`); the cases marked `FMA_ONLY` also check that nothing beyond FMA's API shows. The
launcher forks the stand-in runtime (vLLM is not the point here), keeps 5 events of history so FMA's
history boundary is reachable (FMA keeps 1000; the rule is the same), and kills after a 2 s stop grace
(FMA's is 10 s).

Where dualpods differs from FMA on purpose (an unknown GPU is a 400, IDs are restricted, a used port is
a 409, a 416 carries a JSON body outside the FMA-only mode), docs/fma-compatibility.md says so and why;
those behaviours are tested in test_launcher_api.py.
"""

import asyncio
import json
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from api.launcher import FMA_EVENT_TYPES, FMA_STATE_KEYS, WATCH_HEARTBEAT_S
from e2e.cluster.ports import free_port
from e2e.launcher_process import LauncherProcess
from e2e.waiting import wait_for
from launcher.__main__ import parse_args
from tests.test_launcher_api import instance_processes

BASE = "/v2/vllm/instances"
HISTORY = 5
STOP_GRACE_S = 2.0
MIB = 1024 * 1024
FMA_ENDPOINTS = {
    "index": "GET /",
    "health": "GET /health",
    "create_instance": "POST /v2/vllm/instances",
    "create_named_instance": "PUT /v2/vllm/instances/{instance_id}",
    "delete_instance": "DELETE /v2/vllm/instances/{instance_id}",
    "delete_all_instances": "DELETE /v2/vllm/instances",
    "get_instance_status": "GET /v2/vllm/instances/{instance_id}",
    "get_all_instances": "GET /v2/vllm/instances",
    "get_instance_logs": "GET /v2/vllm/instances/{instance_id}/log",
    "watch_instances": "GET /v2/vllm/instances/watch",
}
DUALPODS, FMA_ONLY = "dualpods", "fma-only"


@dataclass
class Launcher:
    """One launcher under test and a client session to it."""

    process: LauncherProcess
    mode: str
    http: aiohttp.ClientSession

    @property
    def fma_only(self) -> bool:
        return self.mode == FMA_ONLY

    async def create(self, instance_id: str | None = None, extra: str = "", **body: Any) -> tuple[dict[str, Any], int]:
        """(the 201 answer, the instance's port)."""
        port = free_port()
        body.setdefault("options", f"--model tiny --port {port} {extra}".strip())
        method, path = ("PUT", f"{BASE}/{instance_id}") if instance_id else ("POST", BASE)
        async with self.http.request(method, path, json=body) as response:
            assert response.status == 201, await response.text()
            state: dict[str, Any] = await response.json()
        return state, port

    async def get(self, path: str, **kwargs: Any) -> tuple[int, Any]:
        async with self.http.get(path, **kwargs) as response:
            return response.status, await response.json()

    async def listing(self, detail: bool = True) -> dict[str, Any]:
        status, body = await self.get(BASE, params={"detail": str(detail)})
        assert status == 200, body
        result: dict[str, Any] = body
        return result

    async def revision(self) -> int:
        return int((await self.listing(detail=False))["revision"])

    def watch(self, since: int | None = None) -> Any:
        """The watch stream (an aiohttp request context), from `since` on."""
        return self.http.get(f"{BASE}/watch", params={} if since is None else {"since": str(since)})

    async def delete(self, instance_id: str) -> dict[str, Any]:
        async with self.http.delete(f"{BASE}/{instance_id}") as response:
            assert response.status == 200, await response.text()
            state: dict[str, Any] = await response.json()
            return state

    async def log(self, instance_id: str, range_header: str | None = None) -> tuple[int, bytes, dict[str, str]]:
        headers = {"Range": range_header} if range_header is not None else None
        async with self.http.get(f"{BASE}/{instance_id}/log", headers=headers) as response:
            return response.status, await response.read(), dict(response.headers)

    async def settle(self, state: dict[str, Any], port: int) -> None:
        """Until the instance serves and the launcher has said so (dualpods' READY event), so that no event of it is
        still to come."""
        await serving(port)
        if not self.fma_only:

            async def ready() -> bool:
                return bool((await self.get(f"{BASE}/{state['instance_id']}"))[1]["ready"])

            await wait_for(ready, what="the launcher to see the instance ready", within=10, interval=0.05)

    def check_state(self, state: dict[str, Any]) -> None:
        """FMA's keys are there; in the FMA-only mode nothing else is."""
        assert {"status", "instance_id", "revision", "options"} <= state.keys(), state
        if self.fma_only:
            assert state.keys() <= FMA_STATE_KEYS, state


async def serving(port: int) -> None:
    """Until the instance's own server answers /health (how FMA's clients learn it serves)."""
    async with aiohttp.ClientSession() as http:

        async def healthy() -> bool:
            try:
                async with http.get(f"http://127.0.0.1:{port}/health") as response:
                    return response.status == 200
            except aiohttp.ClientError:
                return False

        await wait_for(healthy, what=f"the instance on port {port} to serve", within=20, interval=0.05)


async def next_event(watch: aiohttp.ClientResponse, timeout: float = 5) -> dict[str, Any]:
    """The next event of a stream, past heartbeat lines."""
    async with asyncio.timeout(timeout):
        while line := await watch.content.readline():
            if line.strip():
                event: dict[str, Any] = json.loads(line)
                return event
    raise AssertionError("the watch stream ended")


async def fma_events(watch: aiohttp.ClientResponse, count: int) -> list[dict[str, Any]]:
    """The next `count` events of FMA's types (dualpods' READY, SLEEPING, AWAKE in between are passed)."""
    events: list[dict[str, Any]] = []
    while len(events) < count:
        event = await next_event(watch)
        if event["type"] in FMA_EVENT_TYPES:
            events.append(event)
    return events


CaseFn = Callable[[Launcher], Awaitable[None]]


@dataclass(frozen=True)
class Case:
    checks: str  # FMA's test, or `launcher.py: <behaviour>`
    run: CaseFn
    modes: tuple[str, ...] = (DUALPODS, FMA_ONLY)


CASES: list[Case] = []


def fma(checks: str, modes: tuple[str, ...] = (DUALPODS, FMA_ONLY)) -> Callable[[CaseFn], CaseFn]:
    def register(run: CaseFn) -> CaseFn:
        CASES.append(Case(checks, run, modes))
        return run

    return register


# ----- VllmConfig and instance creation


@fma("TestVllmConfig::test_vllm_config_with_env_vars")
async def _config_echoed(launcher: Launcher) -> None:
    state, _ = await launcher.create("with-env", gpu_uuids=["GPU-0"], env_vars={"VAR": "value"})
    launcher.check_state(state)
    assert state["gpu_uuids"] == ["GPU-0"]
    assert state["env_vars"] == {"VAR": "value", "CUDA_VISIBLE_DEVICES": "0"}


@fma("TestVllmConfig::test_vllm_config_without_env_vars")
async def _omitted_fields(launcher: Launcher) -> None:
    state, _ = await launcher.create("plain")
    assert not {"gpu_uuids", "env_vars", "annotations"} & state.keys(), state


@fma("TestVllmInstance::test_instance_start")
async def _start(launcher: Launcher) -> None:
    state, port = await launcher.create("started", annotations={"note": "n"})
    assert (state["status"], state["instance_id"], state["annotations"]) == ("running", "started", {"note": "n"})
    assert state["options"] == f"--model tiny --port {port}"
    await serving(port)
    status, _, _ = await launcher.log("started")
    assert status == 200  # the log file exists


@fma("TestVllmMultiProcessManager::test_create_instance_auto_id")
async def _auto_id(launcher: Launcher) -> None:
    state, _ = await launcher.create()
    assert state["status"] == "running"
    assert uuid.UUID(state["instance_id"]).version == 4


@fma("TestAPIEndpoints::test_create_vllm_instance")
async def _post(launcher: Launcher) -> None:
    state, _ = await launcher.create()
    launcher.check_state(state)
    assert state["status"] == "running"
    assert state["instance_id"]


@fma("TestVllmMultiProcessManager::test_create_instance_custom_id")
async def _custom_id(launcher: Launcher) -> None:
    state, _ = await launcher.create("custom")
    assert (state["status"], state["instance_id"]) == ("running", "custom")


@fma("TestVllmMultiProcessManager::test_create_instance_duplicate_id")
async def _duplicate(launcher: Launcher) -> None:
    await launcher.create("twice")
    async with launcher.http.put(f"{BASE}/twice", json={"options": "--model tiny"}) as response:
        body = await response.json()
    assert response.status == 409
    assert "already exists" in body["detail"]


@fma("launcher.py: unknown body fields are ignored")
async def _unknown_fields(launcher: Launcher) -> None:
    state, _ = await launcher.create("extra", future_field={"x": 1})
    assert "future_field" not in state


@fma("launcher.py: malformed JSON is a 422 with FastAPI's validation body")
async def _malformed_json(launcher: Launcher) -> None:
    async with launcher.http.post(BASE, data=b'{"options": ', headers={"Content-Type": "application/json"}) as answer:
        body = await answer.json()
    assert answer.status == 422
    issue = body["detail"][0]
    assert (issue["type"], issue["loc"][0], issue["msg"]) == ("json_invalid", "body", "JSON decode error")


@fma("launcher.py: a body without options is a 422 naming body.options")
async def _missing_options(launcher: Launcher) -> None:
    async with launcher.http.post(BASE, json={"gpu_uuids": ["GPU-0"]}) as answer:
        body = await answer.json()
    assert answer.status == 422
    assert [(i["loc"], i["type"]) for i in body["detail"]] == [(["body", "options"], "missing")]
    assert (await launcher.listing(detail=False))["count"] == 0


# ----- GPUs


@fma("TestVllmInstance::test_instance_uuid_to_index_translation")
async def _uuid_translation(launcher: Launcher) -> None:
    state, _ = await launcher.create("three-gpus", gpu_uuids=["GPU-0", "GPU-2", "GPU-3"])
    assert state["env_vars"]["CUDA_VISIBLE_DEVICES"] == "0,2,3"


@fma("TestVllmInstance::test_instance_uuid_to_index_translation_creates_env_vars_if_none")
async def _env_vars_created(launcher: Launcher) -> None:
    state, _ = await launcher.create("two-gpus", gpu_uuids=["GPU-1", "GPU-3"])
    assert state["env_vars"] == {"CUDA_VISIBLE_DEVICES": "1,3"}


@fma("TestVllmInstance::test_instance_uuid_to_index_translation_preserves_existing_env_vars")
async def _env_vars_kept(launcher: Launcher) -> None:
    state, _ = await launcher.create("kept", gpu_uuids=["GPU-2"], env_vars={"A": "1", "B": "2"})
    assert state["env_vars"] == {"A": "1", "B": "2", "CUDA_VISIBLE_DEVICES": "2"}


@fma("TestVllmInstance::test_instance_no_uuid_translation_when_gpu_uuids_none")
async def _no_translation(launcher: Launcher) -> None:
    state, _ = await launcher.create("no-gpus", env_vars={"A": "1"})
    assert state["env_vars"] == {"A": "1"}


@fma("launcher.py: gpu_uuids [] leaves CUDA_VISIBLE_DEVICES unset (every GPU visible)")
async def _empty_gpu_list(launcher: Launcher) -> None:
    state, _ = await launcher.create("all-gpus", gpu_uuids=[], env_vars={"A": "1"})
    assert (state["gpu_uuids"], state["env_vars"]) == ([], {"A": "1"})


# ----- reading, stopping, deleting


@fma("TestAPIEndpoints::test_get_instance_status")
async def _get_state(launcher: Launcher) -> None:
    await launcher.create("read-me", env_vars={"A": "1"})
    status, state = await launcher.get(f"{BASE}/read-me")
    assert status == 200
    launcher.check_state(state)
    assert (state["status"], state["env_vars"]) == ("running", {"A": "1"})
    assert state["options"].startswith("--model tiny --port ")


@fma("TestVllmMultiProcessManager::test_get_instance_status_nonexistent")
async def _get_unknown(launcher: Launcher) -> None:
    status, body = await launcher.get(f"{BASE}/nobody")
    assert (status, body["detail"]) == (404, "Instance nobody not found")


@fma("TestVllmMultiProcessManager::test_get_all_instances_status")
async def _all_states(launcher: Launcher) -> None:
    for name in ("first", "second"):
        await launcher.create(name, annotations={"name": name})
    listing = await launcher.listing()
    assert (listing["total_instances"], listing["running_instances"]) == (2, 2)
    assert {i["instance_id"]: i["annotations"]["name"] for i in listing["instances"]} == {
        "first": "first",
        "second": "second",
    }
    for state in listing["instances"]:
        launcher.check_state(state)


@fma("TestAPIEndpoints::test_list_instances")
async def _list(launcher: Launcher) -> None:
    await launcher.settle(*await launcher.create("listed"))
    ids = await launcher.listing(detail=False)
    assert (ids["instance_ids"], ids["count"]) == (["listed"], 1)
    detailed = await launcher.listing(detail=True)
    assert detailed["revision"] == ids["revision"] >= 1
    assert detailed["total_instances"] == 1
    if launcher.fma_only:
        assert ids.keys() == {"revision", "instance_ids", "count"}
        assert detailed.keys() == {"revision", "total_instances", "running_instances", "instances"}


@fma("launcher.py: detail takes pydantic's boolean spellings; anything else is a 422")
async def _detail_spellings(launcher: Launcher) -> None:
    for spelling in ("false", "False", "0", "off", "f", "n", "no", "NO"):
        status, body = await launcher.get(BASE, params={"detail": spelling})
        assert (status, "instance_ids" in body) == (200, True), spelling
    for spelling in ("true", "True", "1", "on", "t", "y", "yes"):
        status, body = await launcher.get(BASE, params={"detail": spelling})
        assert (status, "instances" in body) == (200, True), spelling
    status, body = await launcher.get(BASE, params={"detail": "abc"})
    assert status == 422
    assert [(i["loc"], i["type"]) for i in body["detail"]] == [(["query", "detail"], "bool_parsing")]
    assert {"loc", "msg", "type"} <= body["detail"][0].keys()


@fma("TestVllmInstance::test_instance_stop")
async def _stop(launcher: Launcher) -> None:
    await launcher.create("to-stop")
    state = await launcher.delete("to-stop")
    assert (state["status"], state["instance_id"]) == ("stopped", "to-stop")


@fma("TestVllmInstance::test_instance_force_kill")
async def _force_kill(launcher: Launcher) -> None:
    _, port = await launcher.create("stubborn", extra="--shutdown-delay 60")
    await serving(port)  # and so handling SIGTERM
    started = time.monotonic()
    state = await launcher.delete("stubborn")
    took = time.monotonic() - started
    assert state["status"] == "stopped"
    assert STOP_GRACE_S <= took < STOP_GRACE_S + 3, took
    assert "stubborn" not in instance_processes(launcher.process)


@fma("TestVllmMultiProcessManager::test_stop_instance")
async def _stop_forgets(launcher: Launcher) -> None:
    await launcher.create("forgotten")
    assert (await launcher.delete("forgotten"))["status"] == "stopped"
    status, _ = await launcher.get(f"{BASE}/forgotten")
    assert status == 404


@fma("TestVllmMultiProcessManager::test_stop_nonexistent_instance")
async def _delete_unknown(launcher: Launcher) -> None:
    async with launcher.http.delete(f"{BASE}/nobody") as response:
        assert (response.status, (await response.json())["detail"]) == (404, "Instance nobody not found")


@fma("TestVllmMultiProcessManager::test_stop_all_instances")
async def _stop_all(launcher: Launcher) -> None:
    for name in ("one", "two", "three"):
        await launcher.create(name)
    listed = (await launcher.listing(detail=False))["count"]
    async with launcher.http.delete(BASE) as response:
        result = await response.json()
    assert (response.status, result["status"], result["total_stopped"]) == (200, "all_stopped", listed)
    assert {s["status"] for s in result["stopped_instances"]} == {"stopped"}
    assert (await launcher.listing(detail=False))["instance_ids"] == []


@fma("TestAPIEndpoints::test_delete_all_instances")
async def _delete_all_empty(launcher: Launcher) -> None:
    async with launcher.http.delete(BASE) as response:
        assert (response.status, await response.json()) == (
            200,
            {"status": "all_stopped", "stopped_instances": [], "total_stopped": 0},
        )


# ----- the index, health, documents


@fma("TestAPIEndpoints::test_health_endpoint")
async def _health(launcher: Launcher) -> None:
    assert await launcher.get("/health") == (200, {"status": "OK"})


@fma("TestAPIEndpoints::test_index_endpoint")
async def _index(launcher: Launcher) -> None:
    status, index = await launcher.get("/")
    assert (status, index["name"], index["version"]) == (200, "Multi-Instance vLLM Management API", "2.0")
    assert {k: index["endpoints"][k] for k in FMA_ENDPOINTS} == FMA_ENDPOINTS
    if launcher.fma_only:
        assert index["endpoints"] == FMA_ENDPOINTS
    else:
        assert index["endpoints"]["wake_instance"] == "POST /v2/vllm/instances/{instance_id}/wake_up"


@fma("launcher.py: /openapi.json and /docs (FastAPI)")
async def _documents(launcher: Launcher) -> None:
    status, document = await launcher.get("/openapi.json")
    assert (status, document["info"]["title"]) == (200, "Multi-Instance vLLM Management API")
    assert {path.replace("{instance_id}", "{id}") for path in document["paths"]} >= {
        BASE,
        f"{BASE}/{{id}}",
        f"{BASE}/{{id}}/log",
        f"{BASE}/watch",
        "/health",
        "/",
    }
    async with launcher.http.get("/docs") as response:
        assert response.status == 200
        assert response.content_type == "text/html"


# ----- logs


async def log_with_content(launcher: Launcher, instance_id: str) -> bytes:
    """A serving instance's log (it has logged its start)."""
    _, port = await launcher.create(instance_id)
    await serving(port)
    status, body, _ = await launcher.log(instance_id)
    assert status == 200
    assert body
    return body


@fma("TestAPIEndpoints::test_get_instance_logs_endpoint")
async def _log_without_range(launcher: Launcher) -> None:
    await log_with_content(launcher, "logged")
    status, body, headers = await launcher.log("logged")
    total = int(headers["Content-Range"].rsplit("/", 1)[1])
    assert (status, headers["Content-Type"]) == (200, "application/octet-stream")
    assert headers["Content-Range"] == f"bytes 0-{len(body) - 1}/{total}"
    assert b"serving tiny" in body


@fma("TestAPIEndpoints::test_get_instance_logs_with_range_header")
async def _log_range(launcher: Launcher) -> None:
    full = await log_with_content(launcher, "ranged")
    status, body, headers = await launcher.log("ranged", "bytes=0-4999")
    assert (status, body[: len(full)]) == (206, full[: len(body)])
    assert headers["Content-Range"].startswith(f"bytes 0-{len(body) - 1}/")


@fma("TestAPIEndpoints::test_get_instance_logs_partial_content_206")
async def _log_partial(launcher: Launcher) -> None:
    full = await log_with_content(launcher, "partial")
    status, body, headers = await launcher.log("partial", "bytes=1-3")
    total = int(headers["Content-Range"].rsplit("/", 1)[1])
    assert (status, body, headers["Content-Range"]) == (206, full[1:4], f"bytes 1-3/{total}")


@fma("TestAPIEndpoints::test_get_instance_logs_open_ended_range")
async def _log_open_end(launcher: Launcher) -> None:
    full = await log_with_content(launcher, "open")
    status, body, headers = await launcher.log("open", "bytes=2-")
    total = int(headers["Content-Range"].rsplit("/", 1)[1])
    assert (status, headers["Content-Range"]) == (206, f"bytes 2-{total - 1}/{total}")
    assert body[: len(full) - 2] == full[2:]


@fma("TestLogFile::test_end_larger_than_content")
async def _log_end_clamped(launcher: Launcher) -> None:
    await log_with_content(launcher, "clamped")
    status, body, headers = await launcher.log("clamped", "bytes=0-99999999")
    assert (status, headers["Content-Range"]) == (206, f"bytes 0-{len(body) - 1}/{len(body)}")


@fma("TestLogStartOffset::test_start_offset")
async def _log_from_offset(launcher: Launcher) -> None:
    full = await log_with_content(launcher, "offset")
    start = len(full) // 2
    status, body, _ = await launcher.log("offset", f"bytes={start}-")
    assert (status, body[: len(full) - start]) == (206, full[start:])


@fma("TestAPIEndpoints::test_get_instance_logs_range_not_available")
async def _log_beyond(launcher: Launcher) -> None:
    full = await log_with_content(launcher, "beyond")
    status, body, headers = await launcher.log("beyond", f"bytes={len(full) + 10000}-")
    total = int(headers["Content-Range"].removeprefix("bytes */"))
    assert status == 416
    assert total >= len(full)
    if launcher.fma_only:
        assert body == b""


@fma("TestLogStartOffset::test_start_equal_to_length_raises_error")
async def _log_at_length(launcher: Launcher) -> None:
    await log_with_content(launcher, "at-length")
    for _ in range(20):  # the log may grow between the two reads (the launcher's health probes are logged)
        _, _, headers = await launcher.log("at-length", "bytes=0-99999999")
        total = int(headers["Content-Range"].rsplit("/", 1)[1])
        status, _, headers = await launcher.log("at-length", f"bytes={total}-")
        if status == 416:
            assert headers["Content-Range"] == f"bytes */{total}"
            return
    raise AssertionError("the log never stood still between two reads")


@fma("TestVllmInstanceLogs::test_get_log_bytes_empty_file")
async def _log_empty(launcher: Launcher) -> None:
    # Quiet (VLLM_LOGGING_LEVEL, as vLLM) and not listening yet: its log stays empty.
    await launcher.create("silent", extra="--startup-delay 60", env_vars={"VLLM_LOGGING_LEVEL": "WARNING"})
    status, body, headers = await launcher.log("silent")
    assert (status, headers["Content-Range"]) == (416, "bytes */0")
    if launcher.fma_only:
        assert body == b""


@fma("TestLogFile::test_max_log_response_bytes_constant")
async def _log_page(launcher: Launcher) -> None:
    _, port = await launcher.create("chatty")
    await serving(port)
    async with aiohttp.ClientSession() as client:  # each request is an access-log line of about 8 KB
        for _ in range(140):
            async with client.get(f"http://127.0.0.1:{port}/health", params={"pad": "p" * 8000}) as response:
                assert response.status == 200
    for range_header in (None, "bytes=0-"):
        status, body, headers = await launcher.log("chatty", range_header)
        total = int(headers["Content-Range"].rsplit("/", 1)[1])
        assert total > MIB
        assert (status, len(body), headers["Content-Range"]) == (
            200 if range_header is None else 206,
            MIB,
            f"bytes 0-{MIB - 1}/{total}",
        )


@fma("TestAPIEndpoints::test_get_instance_logs_nonexistent_endpoint")
async def _log_unknown(launcher: Launcher) -> None:
    status, body, _ = await launcher.log("nobody")
    assert (status, json.loads(body)["detail"]) == (404, "Instance nobody not found")


@fma("TestAPIEndpoints::test_get_instance_logs_invalid_range")
async def _log_bad_range_first(launcher: Launcher) -> None:
    status, _, _ = await launcher.log("nobody", "invalid")  # the Range is judged before the ID
    assert status == 400


@fma("TestParseRangeHeader::test_suffix_range_rejected")
async def _log_malformed_ranges(launcher: Launcher) -> None:
    # Also TestAPIEndpoints::test_get_instance_logs_suffix_range_rejected, TestParseRangeHeader::test_invalid_unit,
    # ::test_garbage_input and ::test_end_less_than_start.
    await launcher.create("strict")
    for header in ("bytes=-500", "lines=0-10", "garbage", "bytes=10-5", "bytes=0-1,3-4"):
        status, body, _ = await launcher.log("strict", header)
        assert status == 400, header
        assert "Range" in json.loads(body)["detail"]


@fma("TestParseRangeHeader::test_large_values")
async def _log_large_range(launcher: Launcher) -> None:
    await log_with_content(launcher, "small")
    status, _, _ = await launcher.log("small", "bytes=1048576-2097151")
    assert status == 416  # parsed, then unsatisfiable: not a 400


@fma("TestLogFileCleanup::test_stop_terminated_cleans_up_log_file")
async def _log_removed(launcher: Launcher) -> None:
    await log_with_content(launcher, "cleaned")
    await launcher.delete("cleaned")
    status, _, _ = await launcher.log("cleaned")
    assert status == 404


# ----- events


@fma("TestWatchAPIEndpoint::test_watch_endpoint_content_type")
async def _watch_headers(launcher: Launcher) -> None:
    async with launcher.watch() as watch:
        assert watch.status == 200
        assert watch.headers["Content-Type"] == "application/x-ndjson"
        assert watch.headers["X-Content-Type-Options"] == "nosniff"


@fma("TestWatchAPIEndpoint::test_watch_without_since_sends_initial_state")
async def _watch_initial(launcher: Launcher) -> None:
    for name in ("a", "b"):
        await launcher.create(name)
    revisions = {i["instance_id"]: i["revision"] for i in (await launcher.listing())["instances"]}
    async with launcher.watch() as watch:
        initial = [await next_event(watch) for _ in revisions]
    assert {(e["type"], e["object"]["instance_id"], e["object"]["revision"]) for e in initial} == {
        ("CREATED", name, revision) for name, revision in revisions.items()
    }


@fma("TestEventBroadcaster::test_publish_and_watch")
async def _watch_since(launcher: Launcher) -> None:
    revision = await launcher.revision()
    async with launcher.watch(revision) as watch:
        state, _ = await launcher.create("watched")
        event = await next_event(watch)
    assert (event["type"], event["object"]["revision"], state["revision"]) == ("CREATED", revision + 1, revision + 1)


@fma("TestEventBroadcaster::test_publish_tracks_sequential_revisions")
async def _sequential_revisions(launcher: Launcher) -> None:
    # Also TestWatchAPIEndpoint::test_watch_with_since_streams_events: no top-level revision, `object.revision`.
    revision = await launcher.revision()
    async with launcher.watch(revision) as watch:
        created, port = await launcher.create("counted")
        await serving(port)
        deleted = await launcher.delete("counted")
        events = [await next_event(watch)]
        while events[-1]["type"] != "DELETED":
            events.append(await next_event(watch))
    assert [e["object"]["revision"] for e in events] == list(range(revision + 1, revision + 1 + len(events)))
    assert (events[0]["object"]["revision"], events[-1]["object"]["revision"]) == (
        created["revision"],
        deleted["revision"],
    )
    assert await launcher.revision() == deleted["revision"]
    assert all("revision" not in e for e in events)
    if launcher.fma_only:
        assert [e["type"] for e in events] == ["CREATED", "DELETED"]
        assert all(e.keys() == {"type", "object"} for e in events)


@fma("TestEventBroadcaster::test_multiple_watchers")
async def _two_watchers(launcher: Launcher) -> None:
    revision = await launcher.revision()
    async with launcher.watch(revision) as one, launcher.watch(revision) as two:
        await launcher.create("seen-twice")
        await launcher.delete("seen-twice")
        first, second = await fma_events(one, 2), await fma_events(two, 2)
    assert first == second
    assert [e["type"] for e in first] == ["CREATED", "DELETED"]


@fma("TestEventBroadcaster::test_watch_since_revision")
async def _replay(launcher: Launcher) -> None:
    revision = await launcher.revision()
    async with launcher.watch(revision) as live:
        await launcher.create("replayed")
        await launcher.delete("replayed")
        seen = await fma_events(live, 2)
    async with launcher.watch(revision) as late:
        replayed = await fma_events(late, 2)
    assert replayed == seen


@fma("TestEventBroadcaster::test_revision_too_old_raises")
async def _history_boundary(launcher: Launcher) -> None:
    while await launcher.revision() < HISTORY + 2:
        name = f"filler-{uuid.uuid4().hex[:6]}"
        await launcher.create(name)
        await launcher.delete(name)
    revision = await launcher.revision()
    async with launcher.watch(revision - HISTORY) as watch:
        assert watch.status == 200
        assert (await next_event(watch))["object"]["revision"] == revision - HISTORY + 1
    status, body = await launcher.get(f"{BASE}/watch", params={"since": str(revision - HISTORY - 1)})
    assert (status, bool(body["detail"])) == (410, True)


@fma("launcher.py: since=-1 is a 410")
async def _since_negative(launcher: Launcher) -> None:
    status, body = await launcher.get(f"{BASE}/watch", params={"since": "-1"})
    assert (status, bool(body["detail"])) == (410, True)


@fma("launcher.py: a non-integer since is a 422 with FastAPI's validation body")
async def _since_not_integer(launcher: Launcher) -> None:
    status, body = await launcher.get(f"{BASE}/watch", params={"since": "abc"})
    assert status == 422
    assert [(i["loc"], i["type"]) for i in body["detail"]] == [(["query", "since"], "int_parsing")]
    assert body["detail"][0]["msg"]


@fma("launcher.py: since=<current revision> keeps the stream open and quiet")
async def _since_current(launcher: Launcher) -> None:
    revision = await launcher.revision()
    quiet = WATCH_HEARTBEAT_S + 1 if launcher.fma_only else 1.0  # FMA sends no heartbeat lines
    async with launcher.watch(revision) as watch:
        assert watch.status == 200
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(quiet):
                await watch.content.readline()


@fma("TestSentinelWatcher::test_sentinel_invokes_callback_on_exit")
async def _exit_reported(launcher: Launcher) -> None:
    _, port = await launcher.create("mortal")
    await serving(port)
    revision = await launcher.revision()
    async with launcher.watch(revision) as watch:
        os.kill(instance_processes(launcher.process)["mortal"], signal.SIGKILL)
        stopped = (await fma_events(watch, 1))[0]
        assert stopped["type"] == "STOPPED"
        assert (stopped["object"]["status"], stopped["object"]["exit_code"]) == ("stopped", -9)
        if launcher.fma_only:
            assert stopped["object"].keys() <= FMA_STATE_KEYS | {"exit_code"}
        status, state = await launcher.get(f"{BASE}/mortal")
        assert (status, state["status"]) == (200, "stopped")
        assert (await launcher.log("mortal"))[0] == 200  # the log is kept
        await launcher.delete("mortal")
        assert (await fma_events(watch, 1))[0]["type"] == "DELETED"


@fma("TestSentinelWatcher::test_sentinel_cancelled_on_explicit_stop")
async def _no_stopped_on_delete(launcher: Launcher) -> None:
    revision = await launcher.revision()
    async with launcher.watch(revision) as watch:
        await launcher.create("deleted")
        await launcher.delete("deleted")
        assert [e["type"] for e in await fma_events(watch, 2)] == ["CREATED", "DELETED"]


# ----- what the FMA-only mode must not show


@fma("launcher.py: the routes of FMA's launcher, and no others", modes=(FMA_ONLY,))
async def _no_additions(launcher: Launcher) -> None:
    await launcher.create("plain-fma")
    for method, path in (("POST", f"{BASE}/plain-fma/sleep"), ("POST", f"{BASE}/plain-fma/wake_up"),
                         ("GET", "/metrics")):  # fmt: skip
        async with launcher.http.request(method, path) as response:
            assert (response.status, await response.json()) == (404, {"detail": "Not Found"}), path
    async with launcher.watch() as watch:
        event = await next_event(watch)
    assert event.keys() == {"type", "object"}
    assert event["object"].keys() <= FMA_STATE_KEYS
    status, body = await launcher.get(f"{BASE}/watch", params={"since": "-1"})
    assert (status, body.keys()) == (410, {"detail"})


@fma("launcher.py: the fields of a dualpods create body are unknown fields to FMA's launcher", modes=(FMA_ONLY,))
async def _extension_fields_ignored(launcher: Launcher) -> None:
    state, port = await launcher.create("foreign", runtime="no-such-runtime", verify_wakes=True)
    assert state.keys() <= FMA_STATE_KEYS
    await serving(port)


@pytest.fixture(scope="module")
def launchers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LauncherProcess]]:
    """One launcher per mode, started when a case first needs it."""
    started: dict[str, LauncherProcess] = {}

    class Pool(dict[str, LauncherProcess]):
        def __missing__(self, mode: str) -> LauncherProcess:
            flags = ["--stand-in", "--mock-gpus", "4", "--watch-history", str(HISTORY)]
            flags += ["--stop-grace-seconds", str(STOP_GRACE_S), *(["--fma-only"] if mode == FMA_ONLY else [])]
            self[mode] = started[mode] = LauncherProcess(tmp_path_factory.mktemp(f"conformance-{mode}"), flags).start()
            return started[mode]

    yield Pool()
    survivors = {mode: process.stop() for mode, process in started.items()}
    assert not any(survivors.values()), f"a launcher left processes behind: {survivors}"


RUNS = [(mode, case) for mode in (DUALPODS, FMA_ONLY) for case in CASES if mode in case.modes]


@pytest.mark.parametrize(("mode", "case"), RUNS, ids=[f"{mode}: {case.checks}" for mode, case in RUNS])
async def test_fma_behaviour(mode: str, case: Case, launchers: dict[str, LauncherProcess]) -> None:
    process = launchers[mode]
    async with aiohttp.ClientSession(process.url) as http:
        try:
            await case.run(Launcher(process, mode, http))
        finally:
            async with http.delete(BASE) as response:
                assert response.status == 200


def test_the_default_history_is_fmas() -> None:
    """FMA keeps 1000 events for `since`; so does the launcher unless told otherwise."""
    assert parse_args([]).watch_history == 1000
