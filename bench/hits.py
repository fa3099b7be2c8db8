"""Fleet hot-hit rate: how often a requester that could wake a sleeper of its model does, with sleeper-aware
placement off (the stock kube-scheduler alone, as FMA and dualpods placed requesters before it) and on, over the
same waves in one invocation (`e2e/hits.py` says what is measured how).

Three fleet shapes of simulated Nodes with the real controllers and the real kube-scheduler: 200 Nodes x 1 GPU
(device plugin), 50 Nodes x 4 GPUs with DRA, 50 Nodes x 4 GPUs with the device plugin; 20 models; warm-up waves
that leave sleepers where earlier traffic would; then seeded waves of scale-ups and scale-downs (0 -> k -> 0).
One line per shape, and a last line over the shapes where Kubernetes can be told the GPU (1-GPU and DRA Nodes):

    hits[SHAPE]: hot H of P possible (R%), baseline B of P (Rb%); placement p50 X s, p99 Y s
    hits: hot H of P possible (R%), baseline B of P (Rb%); placement p50 X s, p99 Y s

(H and P from the placement-on run, B and its P from the placement-off run; placement time: a requester's Pod
created -> scheduled, in the placement-on run). Exit status 1 when a wave timed out.

Usage: .venv/bin/python bench/hits.py [--shapes 200x1-dp,50x4-dra,50x4-dp] [--waves 8] [--json results.json]
"""

import argparse
import collections
import dataclasses
import json
import os
import platform
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import psutil

from e2e.hits import SHAPES, HitsSpec, Run, ShapeResult, hits_line, run_shape
from e2e.scale import bench_main, progress_line, quantile


def _run_line(run: Run) -> str:
    times = run.placement_times()
    return (
        f"  placement {'on ' if run.placement else 'off'}: {len(run.outcomes)} requesters: hot {run.count('hot')}, "
        f"warm {run.count('warm')}, cold {run.count('cold')}, not ready {run.count('not ready')}; "
        f"possible-hot {run.possible}; placement p50 {quantile(times, 0.5):.2f} s, p99 {quantile(times, 0.99):.2f} s"
        + (f"; {run.timed_out_waves} waves TIMED OUT" if run.timed_out_waves else "")
        + _decisions(run)
    )


def _decisions(run: Run) -> str:
    """What the placement webhook decided for the run's requesters, and where those it placed landed."""
    results = collections.Counter(o.decision for o in run.outcomes if o.decision is not None)
    if not results:
        return ""
    landed = sum(1 for o in run.outcomes if o.landed)
    hot = sum(1 for o in run.outcomes if o.landed and o.start == "hot")
    return (
        "; decided: "
        + ", ".join(f"{result} {count}" for result, count in sorted(results.items()))
        + f"; {landed} landed where preferred, {hot} of them hot"
    )


def report(spec: HitsSpec, results: list[ShapeResult]) -> list[str]:
    lines = [
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, {psutil.cpu_count()} CPUs, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB, load average {os.getloadavg()[0]:.2f}",
        f"{spec.models} models; {spec.warmup_waves} warm-up waves of every model, then {spec.waves} waves of "
        f"{spec.models_per_wave} models at 1..{spec.max_replicas} replicas, placement off then on; seed {spec.seed}",
    ]
    for result in results:
        shape = result.shape
        lines.append(
            f"{shape.name} ({shape.nodes} Nodes x {shape.gpus_per_node} GPUs, {shape.gpu_mode}): cluster up in "
            f"{result.cluster_up_seconds:.0f} s, launchers Ready in {result.launchers_ready_seconds:.0f} s, "
            f"{result.sleepers_after_warmup} sleepers after the warm-up, {result.seconds:.0f} s in all"
        )
        lines += [_run_line(run) for run in result.runs]
    lines += [hits_line(f"hits[{r.shape.name}]", [r]) for r in results]
    lines.append(hits_line("hits", [r for r in results if r.shape.names_gpu]))
    return lines


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"of {', '.join(SHAPES)}")
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--warmup-waves", type=int, default=3)
    parser.add_argument("--waves", type=int, default=8)
    parser.add_argument("--models-per-wave", type=int, default=6)
    parser.add_argument("--max-replicas", type=int, default=3)
    parser.add_argument("--seed", type=int, default=44)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a chart value (repeatable)")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    return parser.parse_args()


async def main() -> int:
    args = _args()
    unknown = [name for name in args.shapes.split(",") if name not in SHAPES]
    if unknown:
        sys.exit(f"bench/hits.py: unknown shapes {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    spec = HitsSpec(
        shapes=tuple(SHAPES[name] for name in args.shapes.split(",")),
        models=args.models,
        warmup_waves=args.warmup_waves,
        waves=args.waves,
        models_per_wave=args.models_per_wave,
        max_replicas=args.max_replicas,
        seed=args.seed,
        chart_values=tuple(args.set),
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-hits-") as tmp:
        for shape in spec.shapes:
            results.append(await run_shape(spec, shape, Path(tmp), progress_line))
    if args.json is not None:
        args.json.write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=2) + "\n")
    print("\n".join(report(spec, results)))
    return 1 if any(run.timed_out_waves for r in results for run in r.runs) else 0


if __name__ == "__main__":
    bench_main(main, "bench/hits.py")
