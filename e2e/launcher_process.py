"""Run `python -m launcher` as a real subprocess on a loopback port, for tests and benchmarks.

`stop()` sends SIGTERM, as Kubernetes does, and reports every descendant still alive afterwards,
so callers can assert that the launcher leaves nothing behind.
"""

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from e2e.cluster.ports import free_port

REPO = Path(__file__).resolve().parents[1]
# A launcher preloads vLLM in 20-30 s on a quiet machine; beside three other test runs (a load average of 15-18 on
# 2 cores) it took over 180 s. The bound only tells a launcher that never comes up.
PRELOAD_TIMEOUT_S = 480.0


def wait_healthy(
    url: str,
    alive: Callable[[], bool],
    timeout: float,
    diagnose: Callable[[], str] = lambda: "",
    started: float | None = None,
) -> float:
    """Poll `url` until it answers 200; the seconds since `started` (default: now). RuntimeError if
    `alive()` turns false first, TimeoutError after `timeout`; `diagnose()` adds context (a log tail)."""
    started = time.monotonic() if started is None else started
    while time.monotonic() - started < timeout:
        if not alive():
            raise RuntimeError(f"the server behind {url} died before it was healthy:\n{diagnose()}")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return time.monotonic() - started
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} not healthy after {timeout} s:\n{diagnose()}")


def offline_environment(tmp_dir: Path) -> dict[str, str]:
    """No hub access, no usage reporting, and caches and temp files inside `tmp_dir`."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CACHE_ROOT": str(tmp_dir / "vllm-cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_dir / "inductor"),
        "TMPDIR": str(tmp_dir),
        "PYTHONPATH": str(REPO),
    }


@dataclass
class LauncherProcess:
    work_dir: Path
    flags: list[str] = field(default_factory=list)
    token: str | None = None
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    host: str = "127.0.0.1"  # another loopback address lets it serve on the launcher's own port, as in a Pod

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.work_dir / "launcher.log"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def start(self) -> "LauncherProcess":
        self.work_dir.mkdir(parents=True, exist_ok=True)
        flags = ["--host", self.host, "--port", str(self.port), *self.flags]
        if self.token:
            token_file = self.work_dir / "token"
            token_file.write_text(self.token)
            flags += ["--auth-token-file", str(token_file)]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "launcher", *flags],
                cwd=REPO,
                env=offline_environment(self.work_dir),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_healthy(f"{self.url}/health", lambda: self.process is not None and self.process.poll() is None,
                         PRELOAD_TIMEOUT_S, self.log_tail)  # fmt: skip
        except BaseException:
            self.stop()  # not left running (with whatever it forked) when it never became healthy
            raise
        return self

    def descendants(self) -> list[psutil.Process]:
        assert self.process is not None
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self, timeout: float = 60.0) -> list[psutil.Process]:
        """SIGTERM the launcher; return the descendants that survived it (should be none)."""
        if self.process is None or self.process.poll() is not None:
            return []
        descendants = self.descendants()
        terminate(self.process, timeout)
        # A process SIGKILLed by the launcher on its way out dies when the kernel next runs it, which on a busy
        # machine can be after the launcher has exited: a survivor is one still alive a moment later.
        _, alive = psutil.wait_procs(descendants, timeout=LEFT_BEHIND_AFTER_S)
        survivors = [p for p in alive if _alive(p)]
        for process in survivors:  # leave the machine clean even when the assertion fails
            process.kill()
        return survivors

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


LEFT_BEHIND_AFTER_S = 5.0  # a SIGKILLed process is gone within milliseconds on a quiet machine


def terminate(process: "subprocess.Popen[bytes]", timeout: float) -> None:
    """SIGTERM a server process, SIGKILL it if it has not exited within `timeout` seconds."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
