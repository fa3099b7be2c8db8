"""The transformers runtime's generation throughput at 1, 4 and 8 concurrent clients, in one run.

One real `python -m transformers_runtime` serves the tiny offline model (fp32, on the CPU). Each
client sends greedy `POST /v1/completions` one after another (`max_tokens` each, `ignore_eos` so
every request generates exactly that many; prompts of different lengths), so k clients keep k
requests in flight. A round measures 1, 4 and 8 clients in turn; tokens/s is the completion tokens
of a phase over its wall time, and the ratio is against 1 client (the one-at-a-time baseline: a
runtime that served one request at a time gave every client count the same tokens/s). The median
over rounds is reported, so the shared machine's noise falls on every client count alike.

Usage: .venv/bin/python bench/transformers_throughput.py [--rounds 3] [--requests 4] [--max-tokens 32]
       [--torch-threads N]
"""

import argparse
import asyncio
import contextlib
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import psutil

from e2e.cluster.ports import free_port
from e2e.launcher_process import REPO, offline_environment, terminate, wait_healthy
from e2e.tiny_model import ensure_tiny_model

HOST = "127.0.0.1"
START_TIMEOUT_S = 120.0
CLIENTS = (1, 4, 8)
TARGET_RATIO_AT_8 = 3.0
PROMPTS = ("def hello(world):", "import os\n", "class Tree:\n    def __init__(self, left, right):", "for i in")


async def client(session: aiohttp.ClientSession, url: str, number: int, requests: int, max_tokens: int) -> int:
    """Send `requests` completions one after another; the completion tokens they generated."""
    tokens = 0
    for index in range(requests):
        body = {
            "prompt": PROMPTS[(number + index) % len(PROMPTS)],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        async with session.post(f"{url}/v1/completions", json=body) as response:
            if response.status != 200:
                raise RuntimeError(f"completion answered {response.status}: {await response.text()}")
            tokens += int((await response.json())["usage"]["completion_tokens"])
    return tokens


async def phase(url: str, clients: int, requests: int, max_tokens: int) -> float:
    """Tokens per second with `clients` clients sending `requests` each."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        started = time.perf_counter()
        counts = await asyncio.gather(*(client(session, url, n, requests, max_tokens) for n in range(clients)))
        elapsed = time.perf_counter() - started
    if sum(counts) != clients * requests * max_tokens:
        raise RuntimeError(f"expected {clients * requests * max_tokens} tokens, got {sum(counts)}")
    return sum(counts) / elapsed


async def measure(url: str, rounds: int, requests: int, max_tokens: int) -> dict[int, list[float]]:
    await phase(url, max(CLIENTS), 1, max_tokens)  # warm-up: first allocations, first batch shapes
    rates: dict[int, list[float]] = {clients: [] for clients in CLIENTS}
    for _ in range(rounds):
        for clients in CLIENTS:
            rates[clients].append(await phase(url, clients, requests, max_tokens))
    return rates


def start_server(model: Path, port: int, work_dir: Path, torch_threads: int | None) -> subprocess.Popen[bytes]:
    env = offline_environment(work_dir)
    if torch_threads is not None:
        env["OMP_NUM_THREADS"] = str(torch_threads)
    flags = ["--model", str(model), "--served-model-name", "tiny", "--host", HOST, "--port", str(port)]
    flags += ["--dtype", "float32", "--max-model-len", "256"]
    with (work_dir / "server.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "transformers_runtime", *flags], cwd=REPO, env=env, stdout=log, stderr=log
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=4, help="per client and phase (default 4)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--torch-threads", type=int, default=None, help="OMP_NUM_THREADS of the server")
    args = parser.parse_args()
    model = ensure_tiny_model(seed=1)
    port = free_port()
    url = f"http://{HOST}:{port}"
    with tempfile.TemporaryDirectory(prefix="bench-throughput-") as tmp, contextlib.ExitStack() as running:
        work_dir = Path(tmp)
        server = start_server(model, port, work_dir, args.torch_threads)
        running.callback(terminate, server, 15)
        log = work_dir / "server.log"
        wait_healthy(f"{url}/health", lambda: server.poll() is None, START_TIMEOUT_S, log.read_text)
        load_before = psutil.getloadavg()[0]
        rates = asyncio.run(measure(url, args.rounds, args.requests, args.max_tokens))
    threads = args.torch_threads or os.environ.get("OMP_NUM_THREADS") or "torch's default"
    machine = f"{psutil.cpu_count()} CPUs, {platform.machine()}, load average {load_before:.1f}"
    print(f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {machine}; torch threads: {threads}")
    print(f"{args.rounds} rounds, {args.requests} requests per client and phase, {args.max_tokens} tokens each")
    print("| clients | tokens/s (median) | per round | vs 1 client |")
    print("|---|---|---|---|")
    baseline = statistics.median(rates[1])
    for clients, values in rates.items():
        median = statistics.median(values)
        rounds = ", ".join(f"{value:.0f}" for value in values)
        print(f"| {clients} | {median:.0f} | {rounds} | **{median / baseline:.2f}x** |")
    ratio = statistics.median(rates[max(CLIENTS)]) / baseline
    print(f"{max(CLIENTS)} clients vs one at a time: {ratio:.2f}x (target >= {TARGET_RATIO_AT_8:g}x)")


if __name__ == "__main__":
    main()
