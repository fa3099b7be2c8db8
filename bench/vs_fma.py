"""Our controllers against FMA's released ones, side by side in one run: the same cluster, launcher, servers and
requesters (issue 46 item 4).

One loopback cluster; FMA's dual-pods controller and populator (v0.6.5-alpha.1, run as FMA's chart runs them:
e2e/fma_controllers.py) in one namespace, then ours (the chart) in another, each driving our launcher with stand-in
model servers (vLLM's HTTP surface, sleep and wake; no model load, so the controllers' part is what differs) and our
requester (its SPI open: FMA's controller sends no token). In each: hot starts (a sleeping instance woken), warm
starts (a new instance on the launcher that runs) and cold starts (a new launcher), alternating. Each start is timed
from the requester's own log (its process start -> told ready) and by the Pod's Ready condition; each start and its
release are charged with the API server's requests (all clients: the same requesters and kubelet for both sets) and
the controllers' CPU seconds. The last line (ratio = ours / FMA's, of the Pod Ready p50):

    vs-fma: hot p50 ours X s, FMA Y s, ratio R; warm p50 ours X s, FMA Y s, ratio R

Usage: .venv/bin/python bench/vs_fma.py [--hot 10] [--warm 5] [--cold 3]
"""

import argparse
import contextlib
import os
import platform
import statistics
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import psutil
from kubernetes_asyncio import client

from e2e.actuation import Actuation, actuate, release
from e2e.cluster.cluster import LoopbackCluster, default_nodes
from e2e.dualpods_env import DualPodsEnv, installed
from e2e.fixtures import fresh_namespace
from e2e.fma_controllers import OPEN_SPI, under_fma
from e2e.scale import api_requests, bench_main, progress_line, quantile

RS = "bench"
PATHS = ("hot", "warm", "cold")
Controllers = Callable[[], dict[str, psutil.Process]]  # the running controllers by component
Setting = tuple[DualPodsEnv, Controllers]


@dataclass
class Run:
    """One controller set's starts, and what they cost."""

    name: str
    starts: dict[str, list[Actuation]] = field(default_factory=lambda: {p: [] for p in PATHS})
    requests: list[int] = field(default_factory=list)  # per start and its release
    cpu_seconds: float = 0.0  # the controllers', over every start and release
    rss_mib: dict[str, float] = field(default_factory=dict)


def controller_cpu(found: dict[str, psutil.Process]) -> float:
    return sum(p.cpu_times().user + p.cpu_times().system for p in found.values())


async def measure(env: DualPodsEnv, args: argparse.Namespace, run: Run, controllers: Controllers) -> None:
    """The same objects and the same sequence of starts for either controller set."""
    await env.create_launcher_config("lc", max_instances=8, launcher_args=["--stand-in"], restricted=False)
    node = (await env.cluster.kubelet.nodes())[0]
    only_there = {"labelSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}}}
    await env.create_population_policy("keep", "lc", count=1, selector=only_there)
    await env.create_isc("hot", "lc", port=8005, options="--model hot")
    for i in range(args.warm):
        await env.create_isc(f"warm-{i}", "lc", port=8006, options=f"--model warm-{i}")
    for i in range(args.cold):  # a LauncherConfig of its own each: the first requester of each makes its launcher
        await env.create_launcher_config(f"lc-cold-{i}", max_instances=1, launcher_args=["--stand-in"],
                                         restricted=False)  # fmt: skip
        await env.create_isc(f"cold-{i}", f"lc-cold-{i}", port=8005, options=f"--model cold-{i}")
    await env.wait_launchers_ready(1)
    await env.create_requesters(RS, "hot", replicas=0, node=node.name, gpu=sorted(node.gpus)[0])
    await env.set_requester_isc(RS, "hot")
    await actuate(env, RS)  # makes the hot instance
    await release(env, RS)

    cpu_before = controller_cpu(controllers())
    for round_ in range(args.hot):
        wanted = [("hot", "hot")]
        wanted += [("warm", f"warm-{round_}")] if round_ < args.warm else []
        wanted += [("cold", f"cold-{round_}")] if round_ < args.cold else []
        for path, isc in wanted:
            before = await api_requests(env.cluster)
            await env.set_requester_isc(RS, isc)
            started = await actuate(env, RS, within=300)
            await release(env, RS)
            run.starts[path].append(started)
            run.requests.append(sum((await api_requests(env.cluster)).by_verb.values()) - sum(before.by_verb.values()))
            progress_line(f"{run.name}: {path} {isc}: Pod Ready {started.pod_ready:.2f} s")
    found = controllers()
    run.cpu_seconds = controller_cpu(found) - cpu_before
    run.rss_mib = {name: p.memory_info().rss / 2**20 for name, p in found.items()}


@contextlib.asynccontextmanager
async def ours(cluster: LoopbackCluster, api: client.ApiClient, work_dir: Path) -> AsyncIterator[Setting]:
    async with fresh_namespace(api, "bench-ours") as namespace, installed(
        cluster, api, namespace, work_dir, images=OPEN_SPI
    ) as env:  # fmt: skip
        yield env, env.controllers.running


@contextlib.asynccontextmanager
async def fmas(cluster: LoopbackCluster, api: client.ApiClient, work_dir: Path) -> AsyncIterator[Setting]:
    async with fresh_namespace(api, "bench-fma") as namespace, under_fma(
        cluster, api, namespace, work_dir, OPEN_SPI
    ) as (env, fma):  # fmt: skip
        yield env, fma.running


def _p(values: list[float], q: float) -> str:
    return f"{quantile(values, q):.2f}" if values else "-"


def report(args: argparse.Namespace, runs: dict[str, Run]) -> list[str]:
    lines = [
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, {psutil.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}; FMA v0.6.5-alpha.1 (its chart's flags) vs ours (the chart's "
        f"defaults); our launcher with stand-in servers, our requester; {args.hot} hot, {args.warm} warm, "
        f"{args.cold} cold starts each",
        f"{'controllers':<12}{'path':<6}{'n':>3}{'told ready p50':>16}{'p99':>7}{'Pod Ready p50':>15}{'p99':>7}"
        f"{'after the SPI listens p50':>27}",
    ]
    for name, run in runs.items():
        for path in PATHS:
            starts = run.starts[path]
            told, ready = [s.total for s in starts], [s.pod_ready for s in starts]
            controllers = [s.total - s.requester_startup for s in starts]  # the requester's own start-up left out
            lines.append(f"{name:<12}{path:<6}{len(starts):>3}{_p(told, 0.5):>16}{_p(told, 0.99):>7}"
                         f"{_p(ready, 0.5):>15}{_p(ready, 0.99):>7}{_p(controllers, 0.5):>27}")  # fmt: skip
    for name, run in runs.items():
        swaps = len(run.requests)
        rss = ", ".join(f"{c} {m:.0f} MiB" for c, m in sorted(run.rss_mib.items()))
        cpu = f"controllers' CPU {run.cpu_seconds:.1f} s ({run.cpu_seconds / swaps:.3f} s a start)"
        lines.append(f"{name}: API requests per start and release {statistics.mean(run.requests):.0f} (all "
                     f"clients); {cpu}; RSS {rss}")  # fmt: skip
    parts = []
    for path in ("hot", "warm"):
        mine, theirs = (statistics.median(s.pod_ready for s in runs[n].starts[path]) for n in ("ours", "FMA"))
        parts.append(f"{path} p50 ours {mine:.2f} s, FMA {theirs:.2f} s, ratio {mine / theirs:.2f}")
    lines.append("vs-fma: " + "; ".join(parts))
    return lines


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hot", type=int, default=10)
    parser.add_argument("--warm", type=int, default=5)
    parser.add_argument("--cold", type=int, default=3)
    args = parser.parse_args()
    runs = {"FMA": Run("FMA"), "ours": Run("ours")}
    with tempfile.TemporaryDirectory(prefix="bench-vs-fma-") as tmp:
        cluster = LoopbackCluster(Path(tmp) / "state")
        await cluster.up(default_nodes(), die_with_parent=True)
        try:
            async with await cluster.api_client() as api:
                for name, setting in (("FMA", fmas), ("ours", ours)):
                    async with setting(cluster, api, Path(tmp) / name) as (env, controllers):
                        await measure(env, args, runs[name], controllers)
        finally:
            cluster.down()
    print("\n".join(report(args, runs)))
    return 0


if __name__ == "__main__":
    bench_main(main, "vs_fma")
