"""`python -m scripts.flake_hunt [--rounds N] [--load W] [--report FILE] TEST_PATH...`: run test modules again and
again with a synthetic CPU load beside them (scripts.cpu_load), as a user's busy machine would be, and write down
every failure: the round, the test, its first error line and the load average at the time (issue 47).

A test that fails only when the machine is busy is a defect (a wall-clock bound on logic, a race the test or the
product has): the hunt finds them before a user does. Each round runs every path given in one pytest process (a
module's fixtures stay whole), its results read from pytest's own JUnit XML report. The report (Markdown) is
appended to, one section per hunt; docs/reliability.md keeps the table of what was found and fixed. Exit status 1
when any test failed. Bounded: `--rounds` runs, each under pytest's own per-test timeout, the load ends with the
hunt."""

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

LOAD_SECONDS_MAX = 4 * 3600  # scripts.cpu_load's own bound; the load is stopped when the hunt ends anyway


@dataclass(frozen=True)
class Failure:
    round: int
    test: str  # pytest's node ID
    first_line: str
    load: float  # the 1-minute load average when the round's run ended


@dataclass
class Round:
    number: int
    seconds: float
    tests: int
    failures: list[Failure]
    load_max: float


def failures_in(junit_xml: Path, round_number: int, load: float) -> tuple[int, list[Failure]]:
    """The tests counted and the failed or errored ones in a pytest JUnit XML report."""
    root = ET.parse(junit_xml).getroot()
    tests, found = 0, []
    for case in root.iter("testcase"):
        tests += 1
        for problem in (*case.findall("failure"), *case.findall("error")):
            path = case.get("classname", "").replace(".", "/")
            test = f"{path}.py::{case.get('name', '')}"
            message = (problem.get("message") or problem.text or "").strip()
            found.append(Failure(round_number, test, message.splitlines()[0][:200] if message else "", load))
    return tests, found


class LoadWatch:
    """The highest 1-minute load average seen while it runs (looked at every second)."""

    def __init__(self) -> None:
        self.highest = 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "LoadWatch":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._done.wait(1.0):
            self.highest = max(self.highest, os.getloadavg()[0])


@contextmanager
def cpu_load(workers: int) -> Iterator[None]:
    """scripts.cpu_load with `workers` busy processes for as long as the block runs (none for 0)."""
    if workers <= 0:
        yield
        return
    load = subprocess.Popen([sys.executable, "-m", "scripts.cpu_load", "--seconds", str(LOAD_SECONDS_MAX),
                             "--workers", str(workers)])  # fmt: skip
    try:
        yield
    finally:
        load.terminate()
        load.wait(30)


def run_round(number: int, paths: Sequence[str], pytest_args: Sequence[str], work: Path) -> Round:
    report = work / f"round-{number}.xml"
    started = time.monotonic()
    with LoadWatch() as watch:
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                        *pytest_args, *paths], check=False)  # fmt: skip
    load = os.getloadavg()[0]
    if report.exists():
        tests, failures = failures_in(report, number, load)
    else:
        tests, failures = 0, [Failure(number, " ".join(paths), "pytest wrote no report (it could not start)", load)]
    return Round(number, time.monotonic() - started, tests, failures, max(watch.highest, load))


def markdown(paths: Sequence[str], load_workers: int, rounds: list[Round]) -> str:
    failures = [f for r in rounds for f in r.failures]
    lines = [
        f"## Flake hunt, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"{platform.machine()}, {os.cpu_count()} CPUs; `scripts.cpu_load --workers {load_workers}` beside it; "
        f"{len(rounds)} rounds of `{' '.join(paths)}`",
        "",
        "| round | tests | failed | minutes | highest load average |",
        "|---|---|---|---|---|",
        *(f"| {r.number} | {r.tests} | {len(r.failures)} | {r.seconds / 60:.1f} | {r.load_max:.1f} |" for r in rounds),
        "",
    ]
    if failures:
        lines += ["| round | test | first error line | load average |", "|---|---|---|---|"]
        lines += [f"| {f.round} | `{f.test}` | {f.first_line.replace('|', '/')} | {f.load:.1f} |" for f in failures]
    else:
        lines.append("No failure.")
    return "\n".join(lines) + "\n\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", help="test modules or directories, as pytest takes them")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--load", type=int, default=2, help="scripts.cpu_load's busy processes beside the tests")
    parser.add_argument("--report", type=Path, default=Path("build/flake-hunt.md"), help="appended to")
    parser.add_argument("--pytest-arg", action="append", default=[], help="passed to pytest (repeatable)")
    args = parser.parse_args()
    if not 1 <= args.rounds <= 100:
        parser.error("--rounds must be in [1, 100]")
    rounds = []
    with tempfile.TemporaryDirectory(prefix="flake-hunt-") as work, cpu_load(args.load):
        for number in range(1, args.rounds + 1):
            found = run_round(number, args.paths, args.pytest_arg, Path(work))
            rounds.append(found)
            print(f"flake hunt: round {number}/{args.rounds}: {found.tests} tests, {len(found.failures)} failed, "
                  f"{found.seconds / 60:.1f} min, load average up to {found.load_max:.1f}", flush=True)  # fmt: skip
    args.report.parent.mkdir(parents=True, exist_ok=True)
    with args.report.open("a") as report:
        report.write(markdown(args.paths, args.load, rounds))
    failed = sum(len(r.failures) for r in rounds)
    print(f"flake hunt: {failed} failures in {len(rounds)} rounds; report: {args.report}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
