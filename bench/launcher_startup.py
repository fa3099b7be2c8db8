"""Time to a healthy model server: forked from the preloaded launcher vs a cold `python -m vllm`.

Rounds alternate the three ways of starting the same server with the same effective arguments, so
the shared machine's noise falls on all of them alike:
  forked       PUT /v2/vllm/instances/{id} on a running launcher -> the instance's /health is 200
  cold         `python -m vllm.entrypoints.launchers.api_server.entry ...` with vLLM's default
               process layout (API server, engine core and worker each import vLLM)
  cold-1proc   the same with VLLM_ENABLE_V1_MULTIPROCESSING=0 (the fastest cold layout on a CPU)

Usage: .venv/bin/python bench/launcher_startup.py [--rounds 3]
"""

import argparse
import contextlib
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import psutil

from e2e.cluster.ports import free_port
from e2e.launcher_process import LauncherProcess, offline_environment, wait_healthy
from e2e.tiny_model import ensure_tiny_model

HEALTH_TIMEOUT_S = 300.0


def request(url: str, method: str, body: dict[str, object] | None = None) -> dict[str, object]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as response:
        result: dict[str, object] = json.loads(response.read())
        return result


def forked(launcher: LauncherProcess, model: Path, round_: int) -> tuple[float, str]:
    port = free_port()
    url = f"{launcher.url}/v2/vllm/instances/bench-{round_}"
    started = time.monotonic()
    state = request(url, "PUT", {"options": f"--model {model} --port {port} --max-model-len 256"})
    try:
        health = f"http://127.0.0.1:{port}/health"
        elapsed = wait_healthy(
            health, lambda: request(url, "GET")["status"] == "running", HEALTH_TIMEOUT_S, started=started
        )
    finally:
        request(url, "DELETE")
    return elapsed, str(state["effective_options"])


def cold(argv: list[str], port: int, work_dir: Path, single_process: bool) -> float:
    env = offline_environment(work_dir)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    if single_process:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    command = [sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry", *argv]
    with (work_dir / f"cold-{port}.log").open("wb") as log:
        started = time.monotonic()
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        health = f"http://127.0.0.1:{port}/health"
        return wait_healthy(health, lambda: server.poll() is None, HEALTH_TIMEOUT_S, started=started)
    finally:
        with contextlib.suppress(ProcessLookupError):  # its own session: the group holds the engine core too
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)


def with_port(argv: list[str], port: int) -> list[str]:
    out = list(argv)
    out[out.index("--port") + 1] = str(port)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model = ensure_tiny_model(seed=1)
    samples: dict[str, list[float]] = {"forked": [], "cold": [], "cold-1proc": []}
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        work_dir = Path(tmp)
        launcher = LauncherProcess(work_dir / "launcher", ["--mock-gpus", "1"])
        preload_started = time.monotonic()
        launcher.start()
        preload = time.monotonic() - preload_started
        try:
            for round_ in range(args.rounds):
                elapsed, effective = forked(launcher, model, round_)
                samples["forked"].append(elapsed)
                argv = shlex.split(effective)
                for name, single_process in (("cold", False), ("cold-1proc", True)):
                    port = free_port()
                    samples[name].append(cold(with_port(argv, port), port, work_dir, single_process))
                print(f"round {round_ + 1}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in samples.items()))
        finally:
            launcher.stop()
    medians = {k: statistics.median(v) for k, v in samples.items()}
    print(f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {psutil.cpu_count()} CPUs, {platform.processor() or 'cpu'}")
    print(f"launcher start incl. preload: {preload:.1f} s; effective options: {effective}")
    print(f"{'start':<12}{'median s':>10}   samples")
    for name, values in samples.items():
        print(f"{name:<12}{medians[name]:>10.2f}   {', '.join(f'{v:.1f}' for v in values)}")
    print(f"ratio forked/cold        = {medians['forked'] / medians['cold']:.3f}  (target <= 0.2)")
    print(f"ratio forked/cold-1proc  = {medians['forked'] / medians['cold-1proc']:.3f}")


if __name__ == "__main__":
    main()
