"""The launcher's REST contract on a real launcher process, forking the stand-in server.

Bad input of every kind gets its documented 4xx and a message that says what is wrong, and no
request leaves a process behind.
"""

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from e2e.cluster.ports import free_port
from e2e.launcher_process import LauncherProcess
from e2e.waiting import wait_for

TOKEN = "s3cret-token"
BASE = "/v2/vllm/instances"


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LauncherProcess]:
    process = LauncherProcess(
        tmp_path_factory.mktemp("launcher-api"),
        ["--stand-in", "--mock-gpus", "2", "--watch-history", "5", "--stop-grace-seconds", "3"],
        token=TOKEN,
    ).start()
    yield process
    assert process.stop() == [], "the launcher left processes behind"


@pytest.fixture
async def http(launcher: LauncherProcess) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(launcher.url, headers=launcher.headers) as session:
        yield session
        async with session.delete(BASE) as response:
            assert response.status == 200


def standin_options(port: int | None = None, extra: str = "") -> str:
    return f"--model tiny --port {port or free_port()} --max-model-len 256 {extra}".strip()


async def create(http: aiohttp.ClientSession, instance_id: str, **body: Any) -> dict[str, Any]:
    body.setdefault("options", standin_options())
    async with http.put(f"{BASE}/{instance_id}", json=body) as response:
        assert response.status == 201, await response.text()
        state: dict[str, Any] = await response.json()
        return state


async def wait_ready(http: aiohttp.ClientSession, instance_id: str, timeout: float = 30) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            async with http.get(f"{BASE}/{instance_id}") as response:
                state: dict[str, Any] = await response.json()
            if state["ready"]:
                return state
            await asyncio.sleep(0.05)


@dataclass
class Case:
    name: str
    method: str
    path: str
    status: int
    message: str
    body: bytes | None = None
    json_body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


DUP = "dup"  # an instance that exists while the table runs

CASES = [
    Case("malformed JSON", "POST", BASE, 400, "malformed JSON", body=b'{"options": "--model x"'),
    Case("body not an object", "POST", BASE, 422, "invalid instance configuration", json_body=["--model"]),
    Case("missing options", "POST", BASE, 422, "options: Field required", json_body={"gpu_uuids": []}),
    Case(
        "options not a string", "POST", BASE, 422, "options: Input should be a valid string", json_body={"options": 3}
    ),
    Case("unbalanced quotes", "POST", BASE, 400, "cannot split", json_body={"options": '--model "tiny'}),
    Case("unknown flag", "POST", BASE, 400, "invalid options", json_body={"options": "--model tiny --port x1"}),
    Case("bad flag value", "POST", BASE, 400, "invalid int value: 'abc'", json_body={"options": "--port abc"}),
    Case(
        "foreign host",
        "POST",
        BASE,
        400,
        "not this launcher's address",
        json_body={"options": "--model tiny --port 9 --host 127.0.0.9"},
    ),
    Case(
        "unknown GPU UUID",
        "POST",
        BASE,
        400,
        "unknown GPU UUID(s) GPU-9; available (2 mock GPUs): GPU-0, GPU-1",
        json_body={"options": standin_options(), "gpu_uuids": ["GPU-0", "GPU-9"]},
    ),
    Case(
        "unknown runtime",
        "POST",
        BASE,
        400,
        "unknown runtime 'sglang'; this launcher runs: transformers, vllm",
        json_body={"options": standin_options(), "runtime": "sglang"},
    ),
    Case("duplicate ID", "PUT", f"{BASE}/{DUP}", 409, f"Instance {DUP} already exists", json_body={"options": "-"}),
    Case("invalid ID", "PUT", f"{BASE}/-dash", 400, "invalid instance ID", json_body={"options": standin_options()}),
    Case("unknown ID", "GET", f"{BASE}/nope", 404, "Instance nope not found"),
    Case("delete unknown ID", "DELETE", f"{BASE}/nope", 404, "Instance nope not found"),
    Case("sleep unknown ID", "POST", f"{BASE}/nope/sleep", 404, "Instance nope not found"),
    Case("log of unknown ID", "GET", f"{BASE}/nope/log", 404, "Instance nope not found"),
    Case("bad sleep level", "POST", f"{BASE}/{DUP}/sleep?level=3", 400, "invalid sleep level 3"),
    Case("sleep level not a number", "POST", f"{BASE}/{DUP}/sleep?level=deep", 400, "not an integer"),
    Case("suffix Range", "GET", f"{BASE}/{DUP}/log", 400, "malformed Range", headers={"Range": "bytes=-10"}),
    Case("Range end before start", "GET", f"{BASE}/{DUP}/log", 400, "end is before", headers={"Range": "bytes=9-2"}),
    Case("Range unit", "GET", f"{BASE}/{DUP}/log", 400, "malformed Range", headers={"Range": "lines=0-2"}),
    Case("since not a number", "GET", f"{BASE}/watch?since=yesterday", 400, "not an integer"),
    Case("negative since", "GET", f"{BASE}/watch?since=-1", 400, "must not be negative"),
    Case("since too old", "GET", f"{BASE}/watch?since=0", 410, "too old"),
    Case("detail not a boolean", "GET", f"{BASE}?detail=maybe", 400, "not a boolean"),
    Case("no token", "GET", BASE, 401, "bearer token", headers={"Authorization": ""}),
    Case("wrong token", "GET", BASE, 401, "bearer token", headers={"Authorization": "Bearer guess"}),
    Case("unknown route", "GET", "/v3/everything", 404, "Not Found"),
    Case("wrong method", "PATCH", BASE, 405, "Method Not Allowed"),
]


async def test_bad_input_gets_a_clear_4xx_and_leaks_nothing(
    launcher: LauncherProcess, http: aiohttp.ClientSession
) -> None:
    dup = await create(http, DUP)
    # Enough events that revision 0 has left the 5-event history kept for `since`.
    await wait_ready(http, DUP)
    for level in (1, 1, 2):
        async with http.post(f"{BASE}/{DUP}/sleep?level={level}") as response:
            assert response.status == 200
        async with http.post(f"{BASE}/{DUP}/wake_up") as response:
            assert response.status == 200
    holder_port = dup["port"]
    cases = [
        *CASES,
        Case(
            "port in use",
            "PUT",
            f"{BASE}/other",
            409,
            f"port {holder_port} is already used by instance {DUP}",
            json_body={"options": standin_options(holder_port)},
        ),
    ]
    failures = []
    for case in cases:
        headers = {k: v for k, v in case.headers.items() if v} or None
        if case.headers.get("Authorization") == "":
            async with aiohttp.ClientSession(launcher.url) as anonymous:
                status, text, _ = await _send(anonymous, case, headers)
        else:
            status, text, _ = await _send(http, case, headers)
        detail = json.loads(text).get("detail", "") if text else ""
        if status != case.status or case.message not in detail:
            failures.append(f"{case.name}: got {status} {text!r}, want {case.status} with {case.message!r}")
    assert not failures, "\n".join(failures)
    # Only the one instance this test created runs: no rejected request forked anything.
    assert list(instance_processes(launcher)) == [DUP]


async def _send(session: aiohttp.ClientSession, case: Case, headers: dict[str, str] | None) -> tuple[int, str, Any]:
    kwargs: dict[str, Any] = {"headers": headers}
    if case.body is not None:
        kwargs["data"] = case.body
    elif case.json_body is not None:
        kwargs["json"] = case.json_body
    async with session.request(case.method, case.path, **kwargs) as response:
        return response.status, await response.text(), response.headers


async def test_health_needs_no_token_and_metrics_do(launcher: LauncherProcess) -> None:
    async with aiohttp.ClientSession(launcher.url) as anonymous:
        async with anonymous.get("/health") as response:
            assert (response.status, await response.json()) == (200, {"status": "OK"})
        async with anonymous.get("/metrics") as response:
            assert response.status == 401
        async with anonymous.get("/metrics", headers=launcher.headers) as response:
            assert response.status == 200
            assert "dualpods_launcher_instances" in await response.text()


async def test_index_lists_the_routes(http: aiohttp.ClientSession) -> None:
    async with http.get("/") as response:
        index = await response.json()
    assert index["version"] == "2.0"
    assert index["endpoints"]["watch_instances"] == f"GET {BASE}/watch"


async def log_size(http: aiohttp.ClientSession, instance_id: str) -> int:
    async with http.get(f"{BASE}/{instance_id}/log") as response:
        return len(await response.read())


async def test_unsatisfiable_range_names_the_log_size(http: aiohttp.ClientSession) -> None:
    await create(http, "quiet")
    await wait_ready(http, "quiet")  # the server has logged its start; then the log only grows with its requests
    sizes = [await log_size(http, "quiet")]

    async def settled() -> bool:  # the access-log line of the last readiness poll may still be coming
        sizes.append(await log_size(http, "quiet"))
        return sizes[-1] == sizes[-2]

    await wait_for(settled, what="the instance's log to stop growing", within=10, interval=0.2)
    size = sizes[-1]
    async with http.get(f"{BASE}/quiet/log", headers={"Range": f"bytes={size + 10}-"}) as response:
        assert response.status == 416
        assert response.headers["Content-Range"] == f"bytes */{size}"


async def test_list_create_delete_and_watch_from_a_revision(http: aiohttp.ClientSession) -> None:
    async with http.get(BASE, params={"detail": "false"}) as response:
        start = await response.json()
    assert start["instance_ids"] == []
    await create(http, "w1", gpu_uuids=["GPU-1"], env_vars={"COLOR": "blue"}, annotations={"isc-name": "a"})
    ready = await wait_ready(http, "w1")
    assert ready["gpu_uuids"] == ["GPU-1"]
    assert ready["annotations"] == {"isc-name": "a"}
    assert ready["process"]["rss_bytes"] > 0
    async with http.delete(f"{BASE}/w1") as response:
        deleted = await response.json()
    assert deleted["status"] == "stopped"
    async with http.get(f"{BASE}/watch", params={"since": str(start["revision"])}) as response:
        events = [json.loads(await response.content.readline()) for _ in range(3)]
    assert [e["type"] for e in events] == ["CREATED", "READY", "DELETED"]
    assert [e["object"]["revision"] for e in events] == [start["revision"] + n for n in (1, 2, 3)]
    async with http.get(BASE) as response:
        listing = await response.json()
    assert (listing["total_instances"], listing["revision"]) == (0, start["revision"] + 3)


async def test_gpu_uuids_become_cuda_visible_devices(http: aiohttp.ClientSession) -> None:
    state = await create(http, "gpus", gpu_uuids=["GPU-1", "GPU-0"], env_vars={"CUDA_VISIBLE_DEVICES": "7"})
    assert state["gpu_uuids"] == ["GPU-1", "GPU-0"]
    assert state["env_vars"] == {"CUDA_VISIBLE_DEVICES": "1,0"}


def instance_processes(launcher: LauncherProcess) -> dict[str, int]:
    """Instance ID -> PID of the launcher's forked children, from their process titles."""
    assert launcher.process is not None
    titles = {p.pid: " ".join(p.cmdline()).strip() for p in launcher.descendants() if p.ppid() == launcher.process.pid}
    return {title.removeprefix("dualpods-instance "): pid for pid, title in titles.items()}


async def test_a_crashed_instance_is_stopped_with_its_exit_code(
    launcher: LauncherProcess, http: aiohttp.ClientSession
) -> None:
    await create(http, "victim")
    await wait_ready(http, "victim")
    async with http.get(BASE, params={"detail": "false"}) as response:
        revision = (await response.json())["revision"]
    async with http.get(f"{BASE}/watch", params={"since": str(revision)}) as watch:
        os.kill(instance_processes(launcher)["victim"], signal.SIGKILL)
        async with asyncio.timeout(1.0):
            event = json.loads(await watch.content.readline())
    assert (event["type"], event["exit_code"], event["object"]["status"]) == ("STOPPED", -9, "stopped")
    async with http.post(f"{BASE}/victim/wake_up") as response:
        assert response.status == 409
        assert "is stopped (exit code -9)" in (await response.json())["detail"]


async def test_deleting_an_instance_right_after_creating_it_never_stops_the_launcher(
    launcher: LauncherProcess, http: aiohttp.ClientSession
) -> None:
    # A SIGTERM that reached a child before it dropped the launcher's signal handling used to be
    # relayed to the launcher's own event loop, which then shut down.
    for round_ in range(30):
        await create(http, f"brief-{round_}")
        async with http.delete(f"{BASE}/brief-{round_}") as response:
            assert response.status == 200
    async with http.get("/health") as response:
        assert response.status == 200
    assert instance_processes(launcher) == {}
