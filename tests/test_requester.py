"""The requester: FMA's SPI and probes on a real `python -m requester` process, and GPU discovery units.

The processes take their GPUs from `NVIDIA_VISIBLE_DEVICES` (`--gpu-source env`), as in the loopback
cluster; NVML discovery is tested against a fake NVML module, since this machine has no GPU.
"""

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from e2e.requester_process import REQUESTER_VARIABLES, RequesterProcess
from requester.__main__ import parse_args
from requester.gpus import DeclaredGpus, GpuDiscoveryError, NvmlGpus, SourceChoice, discover
from requester.probes import UNREADY_HOLD_S
from requester.visible_devices import Scope, VisibleDevices, parse

GPUS = ["GPU-aaa", "GPU-bbb"]


@pytest.fixture(scope="module")
def requester(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RequesterProcess]:
    process = RequesterProcess.start(
        tmp_path_factory.mktemp("requester"),
        {"NVIDIA_VISIBLE_DEVICES": ",".join(GPUS), "POD_NAME": "req-1"},
        "--shutdown-timeout",
        "5",
    )
    yield process
    assert process.stop() == 0


async def call(method: str, url: str, data: bytes | None = None) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.request(method, url, data=data) as response:
        return response.status, await response.text()


async def metric_value(requester: RequesterProcess, sample: str) -> float | None:
    status, text = await call("GET", f"{requester.spi}/metrics")
    assert status == 200
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name == sample:
            return float(value)
    return None


async def test_accelerators_are_the_visible_gpus(requester: RequesterProcess) -> None:
    async with aiohttp.ClientSession() as session, session.get(f"{requester.spi}/v1/dual-pods/accelerators") as got:
        assert got.status == 200
        assert got.content_type == "application/json"
        assert await got.json() == GPUS


async def test_memory_usage_is_zero_without_nvml(requester: RequesterProcess) -> None:
    url = f"{requester.spi}/v1/dual-pods/accelerator-memory-usage"
    async with aiohttp.ClientSession() as session, session.get(url) as got:
        assert got.status == 200
        assert await got.json() == dict.fromkeys(GPUS, 0)


async def test_ready_follows_become_ready_and_unready(requester: RequesterProcess) -> None:
    ready = f"{requester.probes}/ready"
    counted = 'dualpods_requester_http_requests_total{code="503",method="GET",route="/ready",server="probes"}'
    unready_answers = await metric_value(requester, counted) or 0
    assert await call("GET", ready) == (503, "Service Unavailable\n")
    assert await metric_value(requester, "dualpods_requester_ready") == 0
    for _ in range(2):  # a repeated relay is harmless
        assert await call("POST", f"{requester.spi}/v1/become-ready") == (200, "OK\n")
    assert await call("GET", ready) == (200, "OK\n")
    assert await metric_value(requester, "dualpods_requester_ready") == 1
    assert await metric_value(requester, "dualpods_requester_first_ready_seconds_count") == 1
    assert await call("POST", f"{requester.spi}/v1/become-unready") == (200, "OK\n")
    assert await call("GET", ready) == (503, "Service Unavailable\n")
    assert await metric_value(requester, "dualpods_requester_ready") == 0
    assert await metric_value(requester, counted) == unready_answers + 2
    logged = [json.loads(line) for line in requester.stderr_path.read_text().splitlines()]
    assert {line["requester"] for line in logged} == {"req-1"}, "every log line names the requester (POD_NAME)"
    assert [line["ready"] for line in logged if line["msg"] == "setting ready"] == [True, True, False]


async def test_an_unready_answer_waits_for_a_become_ready(requester: RequesterProcess) -> None:
    """The kubelet's probe in flight when the controller says ready is answered 200 then, not a period
    later; with nothing said it is answered 503 after UNREADY_HOLD_S, well within a probe's 1 s timeout."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await call("GET", f"{requester.probes}/ready") == (503, "Service Unavailable\n")
    # Held, and then answered: 10 s is twenty holds, and far below a hold that forgot its bound.
    assert UNREADY_HOLD_S <= loop.time() - started < 10, "held, and no longer than its bound"
    probe = asyncio.create_task(call("GET", f"{requester.probes}/ready"))
    await asyncio.sleep(0.1)
    assert not probe.done(), "held"
    assert await call("POST", f"{requester.spi}/v1/become-ready") == (200, "OK\n")
    assert await probe == (200, "OK\n"), "answered by the become-ready"
    assert await call("POST", f"{requester.spi}/v1/become-unready") == (200, "OK\n")


async def test_set_log_appends_only_new_bytes(requester: RequesterProcess) -> None:
    url = f"{requester.spi}/v1/set-log?startPos="
    start = requester.stdout_path.stat().st_size  # whatever earlier tests relayed
    chunks = [(0, b"line one\n"), (0, b"line one\nline two\n"), (9, b"line two\n"), (9, b"line two\nthree\n")]
    for offset, chunk in chunks:
        status, message = await call("POST", f"{url}{start + offset}", chunk)
        assert status == 200, message
    assert message.endswith(f"new contentLength={start + 24}\n")
    assert requester.stdout_path.read_bytes()[start:] == b"line one\nline two\nthree\n"
    status, message = await call("POST", f"{url}{start + 9}", b"line two\n")
    assert (status, "nothing new" in message) == (200, True)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("?startPos=-1", "negative"),
        ("?startPos=1000000", "beyond the current contentLength"),
        ("", "Missing startPos"),
        ("?startPos=", "Missing startPos"),
        ("?startPos=1e3", "as an integer"),
        ("?startPos=abc", "as an integer"),
    ],
)
async def test_set_log_rejects_bad_start_positions(requester: RequesterProcess, query: str, message: str) -> None:
    before = requester.stdout_path.read_bytes()
    status, text = await call("POST", f"{requester.spi}/v1/set-log{query}", b"junk")
    assert status == 400
    assert message in text
    assert requester.stdout_path.read_bytes() == before


@pytest.mark.parametrize(
    ("server", "method", "path", "status"),
    [
        ("spi", "GET", "/nope", 404),
        ("spi", "GET", "/v1/dual-pods", 404),
        ("spi", "GET", "/ready", 404),
        ("probes", "GET", "/v1/dual-pods/accelerators", 404),
        ("spi", "POST", "/v1/dual-pods/accelerators", 405),
        ("spi", "DELETE", "/v1/dual-pods/accelerator-memory-usage", 405),
        ("spi", "GET", "/v1/become-ready", 405),
        ("spi", "PUT", "/v1/become-unready", 405),
        ("spi", "GET", "/v1/set-log", 405),
        ("probes", "POST", "/ready", 405),
    ],
)
async def test_unknown_paths_and_wrong_methods(
    requester: RequesterProcess, server: str, method: str, path: str, status: int
) -> None:
    base = requester.spi if server == "spi" else requester.probes
    assert (await call(method, base + path))[0] == status


async def test_no_gpus_binds_pod_ip_and_stops_promptly(tmp_path: Path) -> None:
    """An empty NVIDIA_VISIBLE_DEVICES means no GPUs; POD_IP picks the address; SIGTERM ends it at once."""
    process = RequesterProcess.start(tmp_path, {"NVIDIA_VISIBLE_DEVICES": "", "POD_IP": "127.0.0.2"})
    try:
        for path in ("accelerators", "accelerator-memory-usage"):
            status, body = await call("GET", f"{process.spi}/v1/dual-pods/{path}")
            assert (status, json.loads(body)) == (500, {"detail": "no GPUs found", "reason": "NoGPUs"})
        with pytest.raises(aiohttp.ClientConnectionError):
            await call("GET", f"http://127.0.0.1:{process.probes_port}/ready")
        async with aiohttp.ClientSession() as session:  # an idle keep-alive connection must not hold it up
            async with session.get(f"{process.probes}/ready") as response:
                assert response.status == 503
            started = time.monotonic()
            assert process.stop() == 0
            assert time.monotonic() - started < 10  # held up, it would wait out the 60 s --shutdown-timeout
    finally:
        process.stop()


def test_flags_win_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in REQUESTER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("POD_NAMESPACE", "models")
    monkeypatch.setenv("SPI_PORT", "9001")
    monkeypatch.setenv("PROBES_PORT", "9000")
    monkeypatch.setenv("POD_IP", "127.3.0.7")
    monkeypatch.setenv("POD_NAME", "req-x")
    monkeypatch.setenv("PROXY_PORT", "9002")
    args = parse_args([])
    assert (args.host, args.spi_port, args.probes_port, args.pod_name) == ("127.3.0.7", 9001, 9000, "req-x")
    assert (args.proxy_port, args.hold_timeout, args.proxy_dial_timeout) == (9002, 60, 10)
    args = parse_args(["--spi-port", "7001", "--host", "127.0.0.1", "--gpu-source", "ENV"])
    assert (args.host, args.spi_port, args.gpu_source) == ("127.0.0.1", 7001, "env")
    monkeypatch.setenv("SPI_PORT", "")  # empty counts as unset, as in FMA
    assert parse_args([]).spi_port == 8081
    args = parse_args([])  # E15 is on by default, trusting the chart's controller ServiceAccounts here
    assert (args.spi_auth, args.namespace, args.trusted.patterns) == (
        "tokenreview",
        "models",
        ("models/*-fma-controllers",),
    )
    monkeypatch.setenv("REQUESTER_TRUSTED_CONTROLLERS", "ctl, other-ns/ctl-*")
    assert parse_args(["--namespace", "ns2"]).trusted.patterns == ("ns2/ctl", "other-ns/ctl-*")
    monkeypatch.setenv("REQUESTER_SPI_AUTH", "NONE")
    monkeypatch.delenv("POD_NAMESPACE")
    assert parse_args([]).spi_auth == "none", "an open SPI needs no namespace"


@pytest.mark.parametrize(
    "argv_or_env",
    [
        ["--spi-port", "0"],
        ["--probes-port", "http"],
        ["--spi-port", "8080"],  # the same as the probes port
        ["--proxy-port", "8081"],  # the same as the SPI port
        ["--hold-timeout", "-5"],
        ["--gpu-source", "cuda"],
        ["--shutdown-timeout", "-1"],
        ["--shutdown-timeout", "nan"],
        {"SPI_PORT": "70000"},
        {"PROXY_PORT": "0"},
        {"REQUESTER_LOG_LEVEL": "loud"},
        ["--spi-auth", "basic", "--namespace", "ns"],
        ["--spi-auth", "tokenreview"],  # no namespace: not in a Pod, no POD_NAMESPACE
        ["--namespace", "ns", "--trusted-controllers", " , "],
        ["--namespace", "ns", "--trusted-controllers", "a/b/c"],
        ["--namespace", "ns", "--trusted-controllers", "/ctl"],
    ],
)
def test_bad_settings_are_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv_or_env: list[str] | dict[str, str]
) -> None:
    for name in REQUESTER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    if isinstance(argv_or_env, dict):
        for name, value in argv_or_env.items():
            monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exited:
        parse_args(argv_or_env if isinstance(argv_or_env, list) else [])
    assert exited.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, VisibleDevices(Scope.ALL)),
        ("all", VisibleDevices(Scope.ALL)),
        (" ALL ", VisibleDevices(Scope.ALL)),
        ("", VisibleDevices(Scope.NONE)),
        ("void", VisibleDevices(Scope.INJECTED)),  # CDI: the GPUs came as device nodes
        ("none", VisibleDevices(Scope.NONE)),
        ("GPU-aaa,GPU-bbb", VisibleDevices(Scope.LISTED, uuids=("GPU-aaa", "GPU-bbb"))),
        (" GPU-aaa , ,GPU-bbb,", VisibleDevices(Scope.LISTED, uuids=("GPU-aaa", "GPU-bbb"))),
        ("2,0", VisibleDevices(Scope.LISTED, indices=(2, 0))),
        ("GPU-aaa,1,weird", VisibleDevices(Scope.LISTED, ("GPU-aaa",), (1,), ("weird",))),
        ("MIG-0f1e", VisibleDevices(Scope.LISTED, uuids=("MIG-0f1e",))),
        # The device plugin's volume-mounts strategy: the runtime then shows NVML only our GPUs.
        (
            "/var/run/nvidia-container-devices",
            VisibleDevices(Scope.ALL, ignored=("/var/run/nvidia-container-devices",)),
        ),
    ],
)
def test_visible_devices_parsing(value: str | None, expected: VisibleDevices) -> None:
    assert parse(value) == expected


class FakeNvmlError(Exception):
    """Raised by the fake NVML where pynvml raises NVMLError."""


class FakeNvml:
    """A FAKE of the pynvml module: there is no GPU on this machine, so these devices are invented.

    `used_bytes[i]` is device i's memory in use (None: reading it fails); devices in `lost` cannot
    be opened at all; `init_error` makes nvmlInit fail as it does without a driver.
    """

    def __init__(
        self, used_bytes: list[int | None], init_error: str | None = None, lost: frozenset[int] = frozenset()
    ) -> None:
        self.used_bytes = used_bytes
        self.init_error = init_error
        self.lost = lost
        self.initialized = False

    def module(self) -> SimpleNamespace:
        """The functions the requester calls, under pynvml's names."""
        return SimpleNamespace(
            NVMLError=FakeNvmlError,
            nvmlInit=self.init,
            nvmlShutdown=self.shutdown,
            nvmlDeviceGetCount=lambda: len(self.used_bytes),
            nvmlDeviceGetHandleByIndex=self.handle,
            nvmlDeviceGetUUID=lambda handle: f"GPU-{handle}{handle}{handle}".encode(),
            nvmlDeviceGetMemoryInfo=self.memory_info,
        )

    def init(self) -> None:
        if self.init_error:
            raise FakeNvmlError(self.init_error)
        self.initialized = True

    def shutdown(self) -> None:
        self.initialized = False

    def handle(self, index: int) -> int:
        if index in self.lost:
            raise FakeNvmlError("GPU is lost")
        return index

    def memory_info(self, handle: int) -> SimpleNamespace:
        used = self.used_bytes[handle]
        if used is None:
            raise FakeNvmlError("GPU is lost")
        return SimpleNamespace(used=used)


MIB = 1024 * 1024


def nvml_gpus(
    visible: str | None, used_bytes: list[int | None], lost: frozenset[int] = frozenset()
) -> tuple[Any, FakeNvml]:
    fake = FakeNvml(used_bytes, lost=lost)
    return discover(SourceChoice.NVML, parse(visible), fake.module()), fake


@pytest.mark.parametrize(
    ("visible", "uuids"),
    [
        (None, ["GPU-000", "GPU-111", "GPU-222"]),
        ("all", ["GPU-000", "GPU-111", "GPU-222"]),
        ("none", []),
        ("void", ["GPU-000", "GPU-111", "GPU-222"]),  # CDI injected exactly the GPUs NVML sees
        ("GPU-222,0", ["GPU-000", "GPU-222"]),  # NVML's order, as nvidia-smi lists them
        ("GPU-111,GPU-999,7", ["GPU-111"]),  # GPUs NVML does not see are left out (and logged)
    ],
)
def test_nvml_discovery_is_restricted_to_the_visible_devices(visible: str | None, uuids: list[str]) -> None:
    gpus, fake = nvml_gpus(visible, [0, 0, 0])
    assert isinstance(gpus, NvmlGpus)
    assert list(gpus.uuids) == uuids
    gpus.close()
    assert not fake.initialized


def test_an_unreadable_gpu_does_not_hide_the_others(caplog: pytest.LogCaptureFixture) -> None:
    gpus, _ = nvml_gpus("0,1,2", [0, 0, 0], lost=frozenset({1}))
    assert list(gpus.uuids) == ["GPU-000", "GPU-222"]
    assert "cannot read GPU 1: GPU is lost" in caplog.text


def test_nvml_memory_usage_in_mib_with_error_lines() -> None:
    gpus, _ = nvml_gpus(None, [1536 * MIB + 5, 0])
    usage = gpus.memory_usage()
    assert (usage.mib, usage.errors) == ({"GPU-000": 1536, "GPU-111": 0}, [])
    gpus, _ = nvml_gpus(None, [MIB, None])
    usage = gpus.memory_usage()
    assert usage.mib == {"GPU-000": 1}
    assert usage.errors == ["cannot read the memory use of GPU-111: GPU is lost"]


def test_without_nvml_auto_falls_back_and_nvml_fails(caplog: pytest.LogCaptureFixture) -> None:
    no_driver = FakeNvml([0], init_error="Driver Not Loaded").module()
    gpus = discover(SourceChoice.AUTO, parse("GPU-aaa,3"), no_driver)
    assert isinstance(gpus, DeclaredGpus)
    assert (gpus.uuids, gpus.memory_usage().mib) == (("GPU-aaa",), {"GPU-aaa": 0})
    assert "Driver Not Loaded" in caplog.text
    assert "ignoring NVIDIA_VISIBLE_DEVICES=3" in caplog.text
    with pytest.raises(GpuDiscoveryError, match="Driver Not Loaded"):
        discover(SourceChoice.NVML, parse("GPU-aaa"), no_driver)
    working = FakeNvml([0])
    assert isinstance(discover(SourceChoice.ENV, parse("GPU-aaa"), working.module()), DeclaredGpus)
    assert not working.initialized, "--gpu-source env never touches NVML"


def test_under_cdi_the_fake_takes_the_gpus_the_loopback_kubelet_declares(caplog: pytest.LogCaptureFixture) -> None:
    """`void` lists no GPU: without NVML only the loopback kubelet's stand-in for NVML's view names them."""
    gpus = discover(SourceChoice.ENV, parse("void"), simulated_nvml="GPU-aaa, GPU-bbb")
    assert isinstance(gpus, DeclaredGpus)
    assert (gpus.uuids, gpus.memory_usage().mib) == (("GPU-aaa", "GPU-bbb"), {"GPU-aaa": 0, "GPU-bbb": 0})
    assert discover(SourceChoice.ENV, parse("GPU-ccc"), simulated_nvml="GPU-aaa").uuids == ("GPU-ccc",)
    assert discover(SourceChoice.ENV, parse("void")).uuids == ()
    assert "only NVML can name them" in caplog.text
