"""How fast the system recovers from faults: the fault soak's convergence times, against the goal of a p99 within 10 s.

The soak (`e2e/test_fault_soak.py`: 100 swaps, 20 faults on the loopback cluster) asserts correctness only: no
violated invariant, and every fault converging within a bound far above its quiet times. How fast it converges
depends on how busy the machine is, so it is measured here, where a figure comes with its conditions: the test
runs in its own pytest process, writes its report, and this script prints it with the load average. The last line:

    fault-soak: convergence p50 X s, p99 Y s, max Z s over N faults (goal p99 <= 10 s: met); violations V

Exit status 1 when the soak failed or the goal was missed.

Usage: .venv/bin/python bench/fault_soak.py [--seed 10] [--json report.json]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

GOAL_P99_S = 10.0
SOAK_TEST = "e2e/test_fault_soak.py"


def soak(seed: int) -> tuple[int, dict[str, Any] | None]:
    """Run the soak in its own pytest process; its exit status and report (None when it wrote none)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "soak.json"
        env = os.environ | {"DUALPODS_SOAK_REPORT": str(report), "DUALPODS_SOAK_SEED": str(seed)}
        status = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", SOAK_TEST], env=env, check=False
        ).returncode
        return status, json.loads(report.read_text()) if report.exists() else None


def soak_line(report: dict[str, Any]) -> str:
    times = report["convergence_s"]
    verdict = "met" if times["p99"] <= GOAL_P99_S else "missed"
    return (
        f"fault-soak: convergence p50 {times['p50']:.2f} s, p99 {times['p99']:.2f} s, max {times['max']:.2f} s "
        f"over {report['faults']} faults (goal p99 <= {GOAL_P99_S:.0f} s: {verdict}); "
        f"violations {len(report['violations'])}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=10, help="the draw of faults (the test's default: 10)")
    parser.add_argument("--json", type=Path, help="also write the soak's report, with the conditions, here")
    args = parser.parse_args()
    started = datetime.now(UTC)
    status, report = soak(args.seed)
    if report is None:
        print(f"fault-soak: the soak wrote no report (pytest exit status {status})")
        return 1
    load = os.getloadavg()
    print(
        f"{started:%Y-%m-%d %H:%M} UTC, {psutil.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / "
        f"{load[2]:.1f} at the end, seed {args.seed}, wall {report['elapsed_s']:.0f} s"
    )
    for fault in report["faults_done"]:
        print(f"  swap {fault['swap']:3d}  {fault['kind']:<17} {fault['convergence_s']:6.2f} s  {fault['what']}")
    if args.json:
        args.json.write_text(json.dumps({"seed": args.seed, "load_average": load, **report}, indent=2))
    print(soak_line(report))
    return 0 if status == 0 and report["convergence_s"]["p99"] <= GOAL_P99_S else 1


if __name__ == "__main__":
    sys.exit(main())
