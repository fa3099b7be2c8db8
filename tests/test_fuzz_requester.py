"""Property-based runs (schemathesis) against a real `python -m requester`: its SPI, open and guarded, and its proxy.

- The open SPI (`--spi-auth none`) exercises every handler with generated input.
- The guarded SPI (the default, E15) must refuse every generated write without a valid token (401/403,
  as a JSON message) and change nothing; it has no API server to review tokens with, so it fails closed.
The proxy is fuzzed in front of the transformers runtime, in test_fuzz_serving.py.
See tests/fuzzing.py for the properties and docs/security.md for the budget.
"""

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from e2e.requester_process import RequesterProcess
from tests.fuzzing import FuzzTarget, detail_message, fuzz

GPUS = "GPU-fuzz-0,GPU-fuzz-1"


def requester_state(requester: RequesterProcess) -> tuple[list[float], int, str, int]:
    """What a refused SPI call must not change: readiness, the proxy's target, the relayed log.

    Readiness is read from the gauge `/ready` answers by, not from `/ready`: an unready `/ready` holds its
    answer half a second (requester/probes.py), and the snapshot is taken twice per refused request.
    """
    metrics = requests.get(f"{requester.spi}/metrics", timeout=5).text
    ready = [sample.value for family in text_string_to_metric_families(metrics) for sample in family.samples
             if sample.name == "dualpods_requester_ready"]  # fmt: skip
    assert len(ready) == 1, f"dualpods_requester_ready not once in /metrics: {ready}"
    config = requests.get(f"{requester.spi}/v1/proxy/config", timeout=5)
    return ready, config.status_code, config.text, requester.stdout_path.stat().st_size


@pytest.fixture
def open_requester(tmp_path: Path) -> Iterator[RequesterProcess]:
    process = RequesterProcess.start(
        tmp_path, {"NVIDIA_VISIBLE_DEVICES": GPUS, "POD_NAME": "fuzz"}, "--hold-timeout", "1"
    )
    yield process
    assert process.stop() == 0


@pytest.fixture
def guarded_requester(tmp_path: Path) -> Iterator[RequesterProcess]:
    env = {"NVIDIA_VISIBLE_DEVICES": GPUS, "POD_NAME": "fuzz", "POD_NAMESPACE": "fuzz", "REQUESTER_SPI_AUTH": ""}
    process = RequesterProcess.start(tmp_path, env, "--spi-auth", "tokenreview")
    yield process
    assert process.stop() == 0


def test_the_open_spi_holds_under_generated_input(open_requester: RequesterProcess) -> None:
    report = fuzz(FuzzTarget(
        "requester SPI", psutil.Process(open_requester.process.pid), open_requester.spi,
        f"{open_requester.spi}/openapi.json", detail_message, lambda: requester_state(open_requester), examples=80,
    ))  # fmt: skip
    assert report.cases > 0, report
    assert report.refused > 0, report


def test_the_guarded_spi_refuses_every_generated_write(guarded_requester: RequesterProcess) -> None:
    report = fuzz(FuzzTarget(
        "guarded requester SPI", psutil.Process(guarded_requester.process.pid), guarded_requester.spi,
        f"{guarded_requester.spi}/openapi.json", detail_message, lambda: requester_state(guarded_requester),
        examples=30,
    ))  # fmt: skip
    writes = {status for status in report.by_status if status in (200, 401, 403)}
    assert 401 in writes, report
    assert requests.get(f"{guarded_requester.probes}/ready", timeout=5).status_code == 503, "never made ready"
