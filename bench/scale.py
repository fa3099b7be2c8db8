"""Scale: R requesters on N simulated GPU Nodes, one launcher per GPU, with the real controllers, ours or FMA's.

A loopback cluster of simulated Nodes (`up --simulated`: the requesters' SPI and probes and the launchers'
API served by simulation processes, one per role and 400 Nodes, on each Pod's own address) gets the Helm
chart with its defaults (requesters authenticate the controller's calls with TokenReviews), a LauncherConfig, a
LauncherPopulationPolicy with one launcher per GPU, M InferenceServerConfigs and R requesters (one
ReplicaSet per model, one GPU each). It measures the populator's time to create the launchers, the time
until every requester is told ready (p50/p99 per requester), a swap wave (half the models scaled to 0, the
others up), what each process spent, and the API server's requests by verb; then takes it all down
(see `e2e/scale.py` for what is measured how). The last line reads
`scale: R requesters on N nodes bound and told ready in X s (p50 A s, p99 B s); controller RSS W MiB, CPU C s`
(the dual-pods controller's peak RSS and CPU seconds over the run). `--controllers fma`: the same with FMA's
released dual-pods controller and populator (v0.6.5-alpha.1, its chart's flags; `e2e/scale.py` says how they
run). Each wave also says what the controllers spent: their CPU per requester, their CPU as a share of the
kube-apiserver's in the same wave (the figure that does not depend on the machine) and their API requests per
requester, as each counts them (ours: dualpods_kube_api_requests_total; FMA's: client-go's
rest_client_requests_total), and the API server's from every client per requester (which counts what FMA's
notifier sidecars ask, and our requesters' TokenReviews). Exit status 1 when a wave timed out or
left a requester unbound, bound twice, or a GPU shared; 130 on Ctrl-C, after the teardown (further Ctrl-Cs
are ignored until the cluster is down). `--requesters 0` measures the populator and the cluster at rest
alone (the simulation's own cost at that size).

Usage: .venv/bin/python bench/scale.py --nodes 250 --gpus-per-node 4 --requesters 1000 [--models 4]
       [--controllers ours|fma] [--json results.json]
"""

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import psutil

from e2e.chart import DUAL_PODS
from e2e.cluster.cluster import APISERVER
from e2e.fma_release import FMA_VERSION
from e2e.profiles import RATE
from e2e.scale import (
    Phase,
    ScaleResult,
    ScaleSpec,
    Wave,
    bench_main,
    progress_line,
    quantile,
    run_scale,
)

TOP_CALLS = 12


def _cpu_line(phase: Phase) -> str:
    busy = sorted(phase.cpu.items(), key=lambda item: -item[1])
    return ", ".join(f"{name} {seconds:.1f} s ({100 * seconds / phase.seconds:.0f}%)" for name, seconds in busy)


def _requests_line(phase: Phase) -> str:
    verbs = ", ".join(f"{verb} {count}" for verb, count in phase.requests_by_verb.items())
    top = list(phase.requests_by_call.items())[:TOP_CALLS]
    refused = ", ".join(f"{call} {count}" for call, count in phase.refusals_by_call.items()) or "none"
    return (
        f"{sum(phase.requests_by_verb.values())} ({verbs}); most: "
        + ", ".join(f"{call} {count}" for call, count in top)
        + f"; refused: {refused}"
    )


def _controllers_line(wave: Wave) -> str:
    """What the controllers spent in the wave, per requester it made ready, and against the API server."""
    phase, told = wave.phase, max(len(wave.latencies), 1)
    cpu = phase.controllers_cpu()
    requests = sum(phase.controller_requests.values())
    return (
        f"  controllers: CPU {cpu:.1f} s ({cpu / told:.3f} s per requester told ready), "
        f"{phase.controllers_share():.2f} of the {APISERVER}'s {phase.cpu.get(APISERVER, 0.0):.1f} s; "
        f"their API requests {requests} ({requests / told:.1f} per requester told ready: "
        + ", ".join(f"{c} {n}" for c, n in phase.controller_requests.items())
        + f"); the {APISERVER}'s requests from every client {sum(phase.requests_by_verb.values()) / told:.1f} per "
        "requester told ready"
    )


def _wave_lines(wave: Wave) -> list[str]:
    state = "TIMED OUT, " if wave.timed_out else ""
    return [
        f"{wave.name} wave: {state}{len(wave.latencies)} told ready in {wave.seconds:.1f} s "
        f"(per requester p50 {quantile(wave.latencies, 0.5):.1f} s, p99 {quantile(wave.latencies, 0.99):.1f} s); "
        f"not ready {wave.not_ready}, unbound {wave.unbound}, double-bound {wave.double_bound}, "
        f"GPUs shared {wave.shared_gpus}",
        "  per requester, p50/p99 s: "
        + ", ".join(f"{step} {p50:.2f}/{p99:.2f}" for step, (p50, p99) in wave.steps.items()),
        _controllers_line(wave),
        f"  CPU: {_cpu_line(wave.phase)}",
        f"  API requests: {_requests_line(wave.phase)}",
    ] + [f"  {count} not ready: {problem}" for problem, count in wave.problems.items()]


def _controller_set(spec: ScaleSpec) -> str:
    if spec.controllers == "fma":
        return f"FMA's {FMA_VERSION} (its chart's flags)"
    return f"ours (chart values: {', '.join(spec.chart_values) or 'defaults'})"


def report(result: ScaleResult) -> list[str]:
    spec = result.spec
    lines = [
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, {psutil.cpu_count()} CPUs, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB, load average {os.getloadavg()[0]:.2f}",
        f"{spec.nodes} nodes x {spec.gpus_per_node} GPUs, {spec.requesters} requesters, {spec.models} models; "
        f"instances: start {spec.startup_delay:g} s, sleep {spec.sleep_delay:g} s, wake {spec.wake_delay:g} s; "
        f"cluster up in {result.cluster_up_seconds:.1f} s; controllers: {_controller_set(spec)}",
        f"populator: {spec.nodes * spec.gpus_per_node} launchers created in {result.launchers_created_seconds:.1f} s, "
        f"all Ready in {result.launchers_ready_seconds:.1f} s",
        f"  CPU: {_cpu_line(result.populator_phase)}",
        f"  API requests: {_requests_line(result.populator_phase)}",
    ]
    if result.idle_phase is not None:
        lines.append(f"idle, every launcher up, for {result.idle_phase.seconds:.0f} s:")
        lines.append(f"  CPU: {_cpu_line(result.idle_phase)}")
        lines.append(f"  API requests: {_requests_line(result.idle_phase)}")
    for wave in result.waves:
        lines += _wave_lines(wave)
    for component, figures in result.controllers.items():
        lines.append(f"{component}: RSS {figures.rss_mib:.0f} MiB (peak {figures.peak_rss_mib:.0f} MiB), "
                     f"CPU {figures.cpu_seconds:.1f} s")  # fmt: skip
    lines.append("processes at the end, RSS and open descriptors: " + ", ".join(
        f"{name} {result.rss_mib[name]:.0f} MiB / {count}" for name, count in sorted(result.descriptors.items())
    ))  # fmt: skip
    for kind, (size, trimmable) in result.pod_bytes.items():
        lines.append(f"a {kind} Pod as cached: {size / 1024:.1f} KiB of JSON, {trimmable / 1024:.1f} KiB of it "
                     "managedFields and last-applied")  # fmt: skip
    for component, metrics in result.controller_metrics.items():
        parts = []
        if metrics.own is not None:
            parts.append(f"reconcile own time (less its calls) p50 <= {metrics.own.p50 * 1000:g} ms, "
                         f"p99 <= {metrics.own.p99 * 1000:g} ms over {metrics.own.count} passes")  # fmt: skip
        if metrics.work is not None:
            parts.append(f"with calls p50 <= {metrics.work.p50:g} s, p99 <= {metrics.work.p99:g} s")
        if metrics.queued is not None:
            parts.append(f"queued p50 <= {metrics.queued.p50:g} s, p99 <= {metrics.queued.p99:g} s")
        if metrics.queue_adds:
            parts.append(f"{metrics.queue_adds} work items added, {metrics.queue_retries} retried after a failure")
        requests = sum(metrics.api_requests.values())
        per = f", {requests / spec.requesters:.1f} per requester" if spec.requesters else ""
        parts.append(f"its API requests {requests}{per} ("
                     + ", ".join(f"{m} {n}" for m, n in metrics.api_requests.items())
                     + f"), {metrics.throttled_seconds:.1f} s waited on the rate limit in all")  # fmt: skip
        lines.append(f"{component}: " + "; ".join(parts) + " (histogram bucket bounds)")
        if metrics.calls:
            lines.append("  its calls, p50/p99 <= s: " + ", ".join(
                f"{purpose} {q.p50:g}/{q.p99:g} (x{q.count})" for purpose, q in metrics.calls.items()))  # fmt: skip
    for component, lines_about in result.restarts.items():
        lines.append(f"{component} RESTARTED: " + "; ".join(lines_about))
    for component, summary in result.profiles.items():
        lines.append(f"{component} profile ({summary.samples / RATE:.1f} s running Python), running in: "
                     + ", ".join(f"{name} {share:.0%}" for name, share in summary.libraries))  # fmt: skip
        lines.append("  by itself: " + ", ".join(f"{frame} {share:.0%}" for frame, share in summary.own))
        lines.append(
            "  ours, with what they call: " + ", ".join(f"{frame} {share:.0%}" for frame, share in summary.ours)
        )
    first = result.waves[0] if result.waves else None
    controller = result.controllers.get(DUAL_PODS)
    if first is not None and controller is not None:
        lines.append(
            f"scale: {spec.requesters} requesters on {spec.nodes} nodes bound and told ready in {first.seconds:.1f} s "
            f"(p50 {quantile(first.latencies, 0.5):.1f} s, p99 {quantile(first.latencies, 0.99):.1f} s); "
            f"controller RSS {controller.peak_rss_mib:.0f} MiB, CPU {controller.cpu_seconds:.1f} s; controllers "
            f"{spec.controllers}, their share of the {APISERVER}'s CPU "
            + ", ".join(f"{wave.name} wave {wave.phase.controllers_share():.2f}" for wave in result.waves)
        )
    return lines


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--gpus-per-node", type=int, required=True)
    parser.add_argument("--requesters", type=int, required=True)
    parser.add_argument("--models", type=int, default=4)
    parser.add_argument("--startup-delay", type=float, default=1.0, help="of each new instance, seconds")
    parser.add_argument("--sleep-delay", type=float, default=0.1)
    parser.add_argument("--wake-delay", type=float, default=0.2)
    parser.add_argument("--probe-period", type=int, default=5, help="of the requesters' readiness probes")
    parser.add_argument("--wave-timeout", type=float, default=600.0, help="seconds a phase may take")
    parser.add_argument("--idle-seconds", type=float, default=20.0, help="the cluster at rest, before the waves")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a chart value (repeatable)")
    parser.add_argument("--controllers", choices=["ours", "fma"], default="ours",
                        help=f"ours (the chart), or FMA's released ones ({FMA_VERSION})")  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write every figure here")
    parser.add_argument("--profile", type=Path, help="sample the controllers with py-spy; raw profiles go here "
                        "(and the controllers' logs, a restarted one's previous run too)")  # fmt: skip
    return parser.parse_args()


async def main() -> int:
    args = _args()
    try:
        spec = ScaleSpec(
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            requesters=args.requesters,
            models=args.models,
            startup_delay=args.startup_delay,
            sleep_delay=args.sleep_delay,
            wake_delay=args.wake_delay,
            probe_period=args.probe_period,
            wave_timeout=args.wave_timeout,
            chart_values=tuple(args.set),
            idle_seconds=args.idle_seconds,
            controllers=args.controllers,
        )
        if args.profile is not None and spec.controllers == "fma":
            raise ValueError("--profile samples Python controllers; FMA's are Go binaries")
    except ValueError as err:
        sys.exit(f"bench/scale.py: {err}")
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        result = await run_scale(spec, Path(tmp), args.profile, progress_line)
    if args.json is not None:
        args.json.write_text(json.dumps(dataclasses.asdict(result), indent=2) + "\n")
    print("\n".join(report(result)))
    return 0 if result.ok else 1


if __name__ == "__main__":
    bench_main(main, "bench/scale.py")
