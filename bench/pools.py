"""Warm pools: how many first starts are hot when every model declares a warm pool, how soon a pool is refilled once
its copies are woken, and whether the pools ever break a budget or displace a requester (`e2e/pools.py` says what is
measured how).

A fleet of simulated Nodes (20 x 4 GPUs, DRA) with the real controllers and the real kube-scheduler; one launcher per
GPU (maxInstances 2, a host sleeper budget of 2 simulated sleepers); 5 models, each declaring a pool of 4 copies over
2 Nodes at least and opting in to sleeper-aware placement, none ever served before; then waves that scale every model
0 -> 4 -> 0 together. First, side by side, the same waves on a fleet of their own with no pool declared (placement
alone: a model's first wave is cold, later ones find the sleepers earlier waves left). The last line:

    pools: hot H of N first starts (R%); refilled p99 X s; over budget V; displaced D

Exit status 1 when a wave timed out.

Usage: .venv/bin/python bench/pools.py [--nodes 20] [--waves 3] [--json results.json]
"""

import argparse
import dataclasses
import json
import os
import platform
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import psutil

from e2e.pools import PoolsResult, PoolsSpec, pools_line, run_pools
from e2e.scale import bench_main, progress_line, quantile


def _starts(result: PoolsResult) -> str:
    counted = {start: sum(1 for o in result.outcomes if o.start == start) for start in ("hot", "warm", "cold")}
    return ", ".join(f"{start} {count}" for start, count in counted.items())


def report(spec: PoolsSpec, result: PoolsResult, baseline: PoolsResult) -> list[str]:
    n = len(baseline.outcomes)
    return [
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, {psutil.cpu_count()} CPUs, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB, load average {os.getloadavg()[0]:.2f}",
        f"{spec.nodes} Nodes x {spec.gpus_per_node} GPUs (DRA); {spec.models} models with pools of {spec.pool} over "
        f"{spec.min_nodes}+ Nodes; {spec.waves} waves of every model 0 -> {spec.replicas} -> 0",
        f"cluster up in {result.cluster_up_s:.0f} s; pools filled {result.filled_s:.1f} s after they were declared; "
        f"{result.seconds:.0f} s in all",
        f"without pools (the same waves, placement on, a fleet of its own): first starts {_starts(baseline)}: "
        f"hot {baseline.hot} of {n} ({100 * baseline.hot / n if n else 0:.1f}%); {baseline.seconds:.0f} s in all"
        + (f"; {baseline.timed_out_waves} waves TIMED OUT" if baseline.timed_out_waves else ""),
        f"with pools: first starts {_starts(result)}; refills {len(result.refills)}, "
        f"p50 {quantile(result.refills, 0.5):.1f} s"
        + (f"; {result.timed_out_waves} waves TIMED OUT" if result.timed_out_waves else ""),
        pools_line(result),
    ]


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--gpus-per-node", type=int, default=4)
    parser.add_argument("--models", type=int, default=5)
    parser.add_argument("--pool", type=int, default=4, help="copies per model's pool")
    parser.add_argument("--replicas", type=int, default=4, help="requesters per model in a wave")
    parser.add_argument("--waves", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a chart value (repeatable)")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    return parser.parse_args()


async def main() -> int:
    args = _args()
    spec = PoolsSpec(nodes=args.nodes, gpus_per_node=args.gpus_per_node, models=args.models, pool=args.pool,
                     replicas=args.replicas, waves=args.waves, chart_values=tuple(args.set))  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-pools-") as tmp:
        progress_line("without pools:")
        baseline = await run_pools(dataclasses.replace(spec, pool=0), Path(tmp) / "baseline", progress_line)
        progress_line("with pools:")
        result = await run_pools(spec, Path(tmp) / "pools", progress_line)
    if args.json is not None:
        figures = {"pools": dataclasses.asdict(result), "baseline": dataclasses.asdict(baseline)}
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print("\n".join(report(spec, result, baseline)))
    return 1 if result.timed_out_waves or baseline.timed_out_waves else 0


if __name__ == "__main__":
    bench_main(main, "bench/pools.py")
