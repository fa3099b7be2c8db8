"""The requester proxy's added latency per request: the same requests sent direct and through the proxy.

A stand-in model server (`python -m standin`, no delays) and a real `python -m requester` run as
processes on loopback; the requester is bound to the stand-in as the dual-pods controller binds it
(`PUT /v1/proxy/config`, then `become-ready`). One client then alternates direct and proxied requests
on two keep-alive connections, so the shared machine's noise falls on both alike:
  completion   POST /v1/completions (max_tokens 4): the guarded path (body parsed, guard, admission)
  health       GET /health: a monitoring path, forwarded as it is
Added latency = p50 (or p99) proxied - p50 (or p99) direct; also the median of the per-pair differences.

Usage: .venv/bin/python bench/proxy_latency.py [--requests 300] [--warmup 30]
"""

import argparse
import contextlib
import http.client
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import psutil

from e2e.cluster.ports import free_port
from e2e.launcher_process import REPO, offline_environment, terminate

HOST = "127.0.0.1"
START_TIMEOUT_S = 30.0
TARGET_ADDED_P50_MS = 2.0
COMPLETION = json.dumps({"model": "bench", "prompt": "def hello(", "max_tokens": 4}).encode()
CASES = {"completion": ("POST", "/v1/completions", COMPLETION), "health": ("GET", "/health", None)}


def start(args: list[str], work_dir: Path, name: str) -> subprocess.Popen[bytes]:
    with (work_dir / f"{name}.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", *args], cwd=REPO, env=offline_environment(work_dir), stdout=log, stderr=log
        )


def wait_answering(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # answering, just not 200
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing answers {url}")


def call(method: str, url: str, body: bytes | None = None) -> None:
    request = urllib.request.Request(url, data=body, method=method)
    urllib.request.urlopen(request, timeout=5).close()


def timed(connection: http.client.HTTPConnection, method: str, path: str, body: bytes | None) -> float:
    """Seconds for one request on a kept-alive connection, body read in full."""
    headers = {"Content-Type": "application/json"} if body else {}
    started = time.perf_counter()
    connection.request(method, path, body=body, headers=headers)
    response = connection.getresponse()
    response.read()
    elapsed = time.perf_counter() - started
    if response.status != 200:
        raise RuntimeError(f"{method} {path} answered {response.status}")
    return elapsed


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(direct_port: int, proxy_port: int, requests: int, warmup: int) -> dict[str, dict[str, list[float]]]:
    direct = http.client.HTTPConnection(HOST, direct_port)
    proxied = http.client.HTTPConnection(HOST, proxy_port)
    samples: dict[str, dict[str, list[float]]] = {}
    try:
        for case, (method, path, body) in CASES.items():
            got: dict[str, list[float]] = {"direct": [], "proxied": []}
            for index in range(warmup + requests):
                # Alternate which goes first, so neither always follows the other's work.
                order = [("direct", direct), ("proxied", proxied)][:: 1 if index % 2 else -1]
                for name, connection in order:
                    elapsed = timed(connection, method, path, body)
                    if index >= warmup:
                        got[name].append(elapsed)
            samples[case] = got
    finally:
        direct.close()
        proxied.close()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300, help="per case and path (default 300)")
    parser.add_argument("--warmup", type=int, default=30)
    args = parser.parse_args()
    backend_port, spi_port, probes_port, proxy_port = (free_port() for _ in range(4))
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp, contextlib.ExitStack() as running:
        work_dir = Path(tmp)
        standin = start(["standin", "--port", str(backend_port), "--model", "bench"], work_dir, "standin")
        running.callback(terminate, standin, 10)
        ports = ["--spi-port", str(spi_port), "--probes-port", str(probes_port), "--proxy-port", str(proxy_port)]
        requester = start(
            # The SPI is open: this measures the proxy; E15's token check is on the SPI only, never per request.
            ["requester", "--host", HOST, *ports, "--gpu-source", "env", "--spi-auth", "none"],
            work_dir,
            "requester",
        )
        running.callback(terminate, requester, 10)  # stopped first
        wait_answering(f"http://{HOST}:{backend_port}/health", standin)
        wait_answering(f"http://{HOST}:{spi_port}/metrics", requester)
        spi = f"http://{HOST}:{spi_port}"
        call("PUT", f"{spi}/v1/proxy/config", json.dumps({"address": HOST, "port": backend_port}).encode())
        call("POST", f"{spi}/v1/become-ready")
        samples = measure(backend_port, proxy_port, args.requests, args.warmup)
    machine = f"{psutil.cpu_count()} CPUs, {platform.machine()}, load average {psutil.getloadavg()[0]:.1f}"
    print(f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {machine}; {args.requests} requests per path and request")
    print("| request | direct p50 | proxied p50 | added p50 | direct p99 | proxied p99 | added p99 | pairwise p50 |")
    print("|---|---|---|---|---|---|---|---|")
    for case, got in samples.items():
        p50 = {name: percentile(values, 0.5) * 1000 for name, values in got.items()}
        p99 = {name: percentile(values, 0.99) * 1000 for name, values in got.items()}
        pairwise = statistics.median(p - d for p, d in zip(got["proxied"], got["direct"], strict=True)) * 1000
        added_p50, added_p99 = p50["proxied"] - p50["direct"], p99["proxied"] - p99["direct"]
        print(
            f"| {case} | {p50['direct']:.3f} ms | {p50['proxied']:.3f} ms | **{added_p50:.3f} ms** "
            f"| {p99['direct']:.3f} ms | {p99['proxied']:.3f} ms | {added_p99:.3f} ms | {pairwise:.3f} ms |"
        )
    added = percentile(samples["completion"]["proxied"], 0.5) - percentile(samples["completion"]["direct"], 0.5)
    print(f"added p50 on the guarded path: {added * 1000:.3f} ms (target <= {TARGET_ADDED_P50_MS} ms)")


if __name__ == "__main__":
    main()
