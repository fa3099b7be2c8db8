"""Run `python -m requester` as a real subprocess on loopback ports, for tests (its SPI, probes and proxy).

`stop()` sends SIGTERM, as the kubelet does, and returns the exit code.
"""

import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from e2e.cluster.ports import free_port
from e2e.launcher_process import REPO, offline_environment

# What the requester reads from its environment; the test machine's own values must not leak in.
REQUESTER_VARIABLES = frozenset(
    {"POD_IP", "POD_NAME", "POD_NAMESPACE", "KUBECONFIG", "SPI_PORT", "PROBES_PORT", "PROXY_PORT"}
    | {"NVIDIA_VISIBLE_DEVICES", "KUBERNETES_SERVICE_HOST"}
    | {f"REQUESTER_{name}" for name in ("GPU_SOURCE", "SHUTDOWN_TIMEOUT", "LOG_LEVEL", "HOLD_TIMEOUT")}
    | {f"REQUESTER_{name}" for name in ("PROXY_DIAL_TIMEOUT", "SPI_AUTH", "TRUSTED_CONTROLLERS")}
)
START_TIMEOUT_S = 20.0


def distinct_free_ports(count: int, taken: frozenset[int] = frozenset(), host: str = "127.0.0.1") -> list[int]:
    """Free ports on `host`, none twice and none `taken` (the kernel may hand a just-released port out again)."""
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(free_port(host=host))
        ports -= taken
    return sorted(ports)


@dataclass
class RequesterProcess:
    """One `python -m requester` on loopback; its stdout (the relayed log) goes to `stdout_path`."""

    process: subprocess.Popen[bytes]
    host: str
    spi_port: int
    probes_port: int
    proxy_port: int
    work_dir: Path

    @property
    def spi(self) -> str:
        return f"http://{self.host}:{self.spi_port}"

    @property
    def probes(self) -> str:
        return f"http://{self.host}:{self.probes_port}"

    @property
    def proxy(self) -> str:
        return f"http://{self.host}:{self.proxy_port}"

    @property
    def stdout_path(self) -> Path:
        return self.work_dir / "stdout"

    @property
    def stderr_path(self) -> Path:
        return self.work_dir / "stderr"

    @classmethod
    def start(cls, work_dir: Path, env: dict[str, str], *flags: str) -> "RequesterProcess":
        """Start it with `env` added to the test environment; returns once both servers answer.

        Its SPI is open (`--spi-auth none`) unless `env` or `flags` say otherwise: the SPI's checks of the
        controller's token are tested against a real API server in e2e/test_requester_auth.py."""
        work_dir.mkdir(parents=True, exist_ok=True)
        # Never FMA's default ports: tests run side by side.
        given = frozenset({int(env["PROXY_PORT"])} if "PROXY_PORT" in env else ())
        spi_port, probes_port, proxy_port = distinct_free_ports(3, given)
        proxy_port = int(env.get("PROXY_PORT") or proxy_port)
        inherited = {k: v for k, v in offline_environment(work_dir).items() if k not in REQUESTER_VARIABLES}
        host = env.get("POD_IP", "127.0.0.1")  # from `env` only, never the test machine's POD_IP
        args = ["--spi-port", str(spi_port), "--probes-port", str(probes_port), "--gpu-source", "env", *flags]
        if "REQUESTER_SPI_AUTH" not in env and "--spi-auth" not in flags:
            args += ["--spi-auth", "none"]
        if "PROXY_PORT" not in env:
            args += ["--proxy-port", str(proxy_port)]
        if "POD_IP" not in env:
            args += ["--host", host]
        with (work_dir / "stdout").open("wb") as out, (work_dir / "stderr").open("wb") as err:
            popen = subprocess.Popen(
                [sys.executable, "-m", "requester", *args], cwd=REPO, env={**inherited, **env}, stdout=out, stderr=err
            )
        requester = cls(popen, host, spi_port, probes_port, proxy_port, work_dir)
        try:
            requester._wait_serving()
        except BaseException:
            requester.stop()
            raise
        return requester

    def _wait_serving(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        pending = [f"{self.spi}/metrics", f"{self.probes}/ready", f"{self.proxy}/ready"]
        while pending:
            if self.process.poll() is not None:
                raise RuntimeError(f"requester exited with {self.process.returncode}:\n{self.stderr_path.read_text()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"requester not serving {pending}:\n{self.stderr_path.read_text()}")
            try:
                urllib.request.urlopen(pending[0], timeout=1).close()
                pending.pop(0)
            except urllib.error.HTTPError:
                pending.pop(0)  # /ready answers 503 while unready: it is serving
            except OSError:
                time.sleep(0.05)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, as the kubelet sends; returns the exit code (killing it if it does not exit)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode
