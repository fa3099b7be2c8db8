"""Property-based runs (schemathesis) against a real transformers runtime, alone and behind the requester's proxy.

The runtime serves the tiny offline model with a short context and few sequences at once, so a generated
completion costs milliseconds; every accepted sleep is undone (`restore`) so that later requests are not
held. The proxy is a real `python -m requester` bound to that runtime: the runtime's answers pass through
it, and the proxy may add none of its own at 5xx. See tests/fuzzing.py for the properties.
"""

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import requests

from api.requester import PROXY_OPENAPI_PATH
from e2e.cluster.ports import free_port
from e2e.launcher_process import REPO, offline_environment, wait_healthy
from e2e.requester_process import RequesterProcess
from tests.fuzzing import FuzzTarget, fuzz, openai_message
from tests.test_fuzz_requester import requester_state

MAX_MODEL_LEN = 24
MAX_NUM_SEQS = 2
QUEUE_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


@dataclass
class Runtime:
    process: "subprocess.Popen[bytes]"
    url: str

    def state(self) -> object:
        """What a refused request must not change: asleep or not, the models and adapters served, and the
        engine's queue (nothing left running or waiting)."""
        sleeping = requests.get(f"{self.url}/is_sleeping", timeout=10).json()
        models = requests.get(f"{self.url}/v1/models", timeout=30).json()
        metrics = requests.get(f"{self.url}/metrics", timeout=10).text
        queue = sorted(line for line in metrics.splitlines() if line.startswith(QUEUE_GAUGES))
        return sleeping, [card["id"] for card in models["data"]], queue

    def wake(self) -> None:
        """Undo an accepted sleep, so that the next generated requests are not held."""
        if requests.get(f"{self.url}/is_sleeping", timeout=10).json()["is_sleeping"]:
            assert requests.post(f"{self.url}/wake_up", timeout=60).status_code == 200


@pytest.fixture(scope="module")
def runtime(model_a: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    work = tmp_path_factory.mktemp("fuzz-runtime")
    port = free_port()
    flags = [
        *("--model", str(model_a), "--served-model-name", "tiny", "--port", str(port), "--dtype", "float32"),
        *("--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_NUM_SEQS), "--enable-lora"),
    ]
    with (work / "runtime.log").open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "transformers_runtime", *flags], cwd=REPO,
                                   env=offline_environment(work), stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    running = Runtime(process, f"http://127.0.0.1:{port}")
    try:
        wait_healthy(f"{running.url}/health", lambda: process.poll() is None, 120, (work / "runtime.log").read_text)
        yield running
    finally:
        process.terminate()
        assert process.wait(30) == 0


def test_the_transformers_runtime_holds_under_generated_input(runtime: Runtime) -> None:
    report = fuzz(FuzzTarget(
        "transformers runtime", psutil.Process(runtime.process.pid), runtime.url, f"{runtime.url}/openapi.json",
        openai_message, runtime.state, examples=80, restore=runtime.wake,
        examples_for={"POST /sleep": 25, "POST /wake_up": 25, "GET /metrics": 5},
    ))  # fmt: skip
    assert report.refused > 0, report
    assert any(200 <= status < 300 for status in report.by_status), report


def test_the_proxy_holds_under_generated_input(runtime: Runtime, tmp_path: Path) -> None:
    requester = RequesterProcess.start(tmp_path, {"NVIDIA_VISIBLE_DEVICES": "GPU-0", "POD_NAME": "fuzz"},
                                       "--hold-timeout", "1")  # fmt: skip
    try:
        port = int(runtime.url.rsplit(":", 1)[1])
        bound = requests.put(f"{requester.spi}/v1/proxy/config", json={"address": "127.0.0.1", "port": port}, timeout=5)
        assert bound.status_code == 200
        assert requests.post(f"{requester.spi}/v1/become-ready", timeout=5).status_code == 200
        report = fuzz(FuzzTarget(
            "requester proxy", psutil.Process(requester.process.pid), requester.proxy,
            f"{requester.spi}{PROXY_OPENAPI_PATH}", openai_message, lambda: requester_state(requester),
            examples=40, rejects_invalid=False,
        ))  # fmt: skip
        assert report.cases > 0, report
    finally:
        assert requester.stop() == 0
