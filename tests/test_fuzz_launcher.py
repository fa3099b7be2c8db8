"""A property-based run (schemathesis) against a real `python -m launcher`, from its own `/openapi.json`.

The launcher forks the stand-in runtime on mock GPUs, so generated creates fork real instances: each
accepted request is undone (`restore`: instances it made are deleted, the one kept for the per-instance
routes is woken, or made again after a generated delete-all). The state a refused request must not
change is the launcher's listing: its revision and every instance's ID, status and sleep. The watch
stream, which an accepted request keeps open for as long as the client reads, is judged by its status
and headers. The launcher runs without a token: with one, schemathesis' negative cases without it
would be sent with it. See tests/fuzzing.py for the properties and docs/security.md for the budget.
"""

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from e2e.cluster.ports import free_port
from e2e.launcher_process import LauncherProcess
from tests.fuzzing import FuzzTarget, fuzz, launcher_message

BASE = "/v2/vllm/instances"
KEPT = "kept"  # the instance the per-instance routes can find


class Launcher:
    def __init__(self, process: LauncherProcess) -> None:
        self.process = process
        self.session = requests.Session()
        self.session.headers.update(process.headers)

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.session.request(method, f"{self.process.url}{path}", timeout=30, **kwargs)
        assert response.status_code < 300, response.text
        return response.json()

    def state(self) -> object:
        listing = self.call("GET", BASE)
        instances = sorted((i["instance_id"], i["status"], i["sleeping"]) for i in listing["instances"])
        return listing["revision"], instances

    def keep(self) -> None:
        """The kept instance, serving and awake."""
        self.call("PUT", f"{BASE}/{KEPT}", json={"options": f"--model tiny --port {free_port()}"})
        deadline = time.monotonic() + 30
        while not self.call("GET", f"{BASE}/{KEPT}")["ready"]:
            assert time.monotonic() < deadline, "the kept instance never became ready"
            time.sleep(0.05)

    def instance_processes(self) -> set[int]:
        """The processes of the instances the launcher lists: each one's server and its descendants."""
        pids = {i["process"]["pid"] for i in self.call("GET", BASE)["instances"] if "process" in i}
        return pids | {child.pid for pid in pids for child in psutil.Process(pid).children(recursive=True)}

    def restore(self) -> None:
        """Undo what an accepted request changed."""
        for instance in self.call("GET", BASE)["instances"]:
            if instance["instance_id"] != KEPT:
                self.call("DELETE", f"{BASE}/{instance['instance_id']}")
            elif instance["status"] != "running":  # killed through its own port: made again
                self.call("DELETE", f"{BASE}/{KEPT}")
            elif instance["sleeping"]:
                self.call("POST", f"{BASE}/{KEPT}/wake_up")
        if KEPT not in self.call("GET", BASE, params={"detail": "false"})["instance_ids"]:
            self.keep()


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    process = LauncherProcess(tmp_path, ["--stand-in", "--mock-gpus", "2", "--stop-grace-seconds", "3"])
    process.start()
    try:
        running = Launcher(process)
        running.keep()
        yield running
    finally:
        assert process.stop() == [], "the launcher left processes behind"


def test_the_launcher_holds_under_generated_input(launcher: Launcher) -> None:
    process = launcher.process
    assert process.process is not None
    report = fuzz(FuzzTarget(
        "launcher", psutil.Process(process.process.pid), process.url, f"{process.url}/openapi.json",
        launcher_message, launcher.state, examples=150, restore=launcher.restore,
        examples_for={"GET /metrics": 5, "GET /health": 5, "GET /": 5},
        streaming=frozenset({f"GET {BASE}/watch"}), accounted_children=launcher.instance_processes,
    ))  # fmt: skip
    assert report.refused > 0, report
    assert any(200 <= status < 300 for status in report.by_status), report
