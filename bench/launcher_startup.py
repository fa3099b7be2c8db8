"""Time to a healthy model server, and where it goes: forked from the launcher's zygote, forked from the
launcher itself (`--no-zygote`), and a cold `python -m vllm`.

Rounds alternate the four ways of starting the same server with the same effective arguments, so
the shared machine's noise falls on all of them alike:
  zygote       PUT /v2/vllm/instances/{id} on a running launcher (its vLLM zygote) -> /health is 200
  launcher     the same on a launcher started with --no-zygote (instances fork from the launcher)
  cold         `python -m vllm.entrypoints.launchers.api_server.entry ...` with vLLM's default
               process layout (API server, engine core and worker each import vLLM)
  cold-1proc   the same with VLLM_ENABLE_V1_MULTIPROCESSING=0 (the fastest cold layout on a CPU)

Phases: the forked starts' come from the launcher's detailed state (`startup`); the cold ones from the
same log marks (`launcher.startup_phases`), recorded by `bench/cold_marked.py`, which runs vLLM's entry
point after marking its own start (`fork` is then the interpreter's start-up). vLLM's default layout
spawns its engine core, whose marks are lost: its weights, KV-cache and warm-up phases are in
`api_listening` for `cold`.

Usage: .venv/bin/python bench/launcher_startup.py [--rounds 5]
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
from launcher.startup_phases import PHASE_NAMES, read_marks, startup_phases

HEALTH_TIMEOUT_S = 300.0
COLD_MARKED = Path(__file__).with_name("cold_marked.py")
STARTS = ("zygote", "launcher", "cold", "cold-1proc")
Sample = tuple[float, dict[str, float]]  # seconds to healthy, seconds per phase


def request(url: str, method: str, body: dict[str, object] | None = None) -> dict[str, object]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as response:
        result: dict[str, object] = json.loads(response.read())
        return result


def forked(launcher: LauncherProcess, model: Path, name: str) -> tuple[Sample, str, str]:
    port = free_port()
    url = f"{launcher.url}/v2/vllm/instances/{name}"
    started = time.monotonic()
    state = request(url, "PUT", {"options": f"--model {model} --port {port} --max-model-len 256"})
    try:
        health = f"http://127.0.0.1:{port}/health"
        elapsed = wait_healthy(
            health, lambda: request(url, "GET")["status"] == "running", HEALTH_TIMEOUT_S, started=started
        )
        while not (detail := request(url, "GET"))["ready"]:  # the launcher's own first healthy answer
            time.sleep(0.02)
    finally:
        request(url, "DELETE")
    startup = detail["startup"]
    assert isinstance(startup, dict)
    return (elapsed, dict(startup["phases"])), str(state["effective_options"]), str(startup["forked_by"])


def cold(argv: list[str], port: int, work_dir: Path, single_process: bool) -> Sample:
    env = offline_environment(work_dir)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    if single_process:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    marks = work_dir / f"cold-{port}.marks"
    command = [sys.executable, str(COLD_MARKED), str(marks), *argv]
    with (work_dir / f"cold-{port}.log").open("wb") as log:
        started = time.monotonic()
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        health = f"http://127.0.0.1:{port}/health"
        elapsed = wait_healthy(health, lambda: server.poll() is None, HEALTH_TIMEOUT_S, started=started)
    finally:
        with contextlib.suppress(ProcessLookupError):  # its own session: the group holds the engine core too
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)
    return elapsed, startup_phases(started, read_marks(marks), started + elapsed)


def with_port(argv: list[str], port: int) -> list[str]:
    out = list(argv)
    out[out.index("--port") + 1] = str(port)
    return out


def print_report(samples: dict[str, list[Sample]], preload: dict[str, float], effective: str) -> None:
    medians = {k: statistics.median(s[0] for s in v) for k, v in samples.items()}
    load = " / ".join(f"{each:.1f}" for each in os.getloadavg())
    memory = psutil.virtual_memory().total / 2**30
    print(f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {psutil.cpu_count()} CPUs, {platform.processor() or 'cpu'}, "
          f"{memory:.0f} GiB, load average {load}")  # fmt: skip
    print("launcher start incl. preload and zygote: " + ", ".join(f"{k} {v:.1f} s" for k, v in preload.items()))
    print(f"effective options: {effective}\n")
    print(f"{'start':<12}{'median s':>10}   samples")
    for name, values in samples.items():
        print(f"{name:<12}{medians[name]:>10.2f}   {', '.join(f'{v[0]:.2f}' for v in values)}")
    print("\nmedian seconds per phase (a phase not marked is counted in the next one)")
    print(f"{'phase':<20}" + "".join(f"{name:>12}" for name in samples))
    for phase in PHASE_NAMES:
        cells = []
        for values in samples.values():
            seen = [v[1][phase] for v in values if phase in v[1]]
            cells.append(f"{statistics.median(seen):>12.3f}" if seen else f"{'-':>12}")
        print(f"{phase:<20}" + "".join(cells))
    print(f"\nratio zygote/cold          = {medians['zygote'] / medians['cold']:.3f}  (target <= 0.10, stretch 0.05)")
    print(f"ratio zygote/cold-1proc    = {medians['zygote'] / medians['cold-1proc']:.3f}")
    print(f"ratio launcher/cold        = {medians['launcher'] / medians['cold']:.3f}  (forked without the zygote)")
    print(f"ratio zygote/launcher      = {medians['zygote'] / medians['launcher']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    model = ensure_tiny_model(seed=1)
    samples: dict[str, list[Sample]] = {name: [] for name in STARTS}
    preload: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        work_dir = Path(tmp)
        launchers = {
            "zygote": LauncherProcess(work_dir / "zygote", ["--mock-gpus", "1"]),
            "launcher": LauncherProcess(work_dir / "launcher", ["--mock-gpus", "1", "--no-zygote"]),
        }
        try:
            for name, launcher in launchers.items():
                started = time.monotonic()
                launcher.start()
                preload[name] = time.monotonic() - started
            for round_ in range(args.rounds):
                for name, launcher in launchers.items():
                    sample, effective, forked_by = forked(launcher, model, f"bench-{round_}")
                    assert forked_by == name, f"{name}: forked by the {forked_by}"
                    samples[name].append(sample)
                argv = shlex.split(effective)
                for name, single_process in (("cold", False), ("cold-1proc", True)):
                    port = free_port()
                    samples[name].append(cold(with_port(argv, port), port, work_dir, single_process))
                print(f"round {round_ + 1}: " + ", ".join(f"{k} {v[-1][0]:.2f} s" for k, v in samples.items()),
                      flush=True)  # fmt: skip
        finally:
            for launcher in launchers.values():
                launcher.stop()
    print_report(samples, preload, effective)


if __name__ == "__main__":
    main()
