"""scripts/cpu_load.py, the synthetic load the suite is run beside (issue 21): bounded, and stopped by a kill."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.processes import children

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_a_kill_of_the_load_stops_its_workers() -> None:
    load = subprocess.Popen([sys.executable, "-m", "scripts.cpu_load", "--seconds", "60", "--workers", "2"],
                            cwd=REPO_ROOT)  # fmt: skip
    workers = children(psutil.Process(load.pid), 2)
    load.terminate()
    assert load.wait(10) == 128 + signal.SIGTERM
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, "a worker kept spinning after its load was killed"


def test_the_load_ends_by_itself() -> None:
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "scripts.cpu_load", "--seconds", "0.5", "--workers", "1"],
                   cwd=REPO_ROOT, check=True, timeout=30)  # fmt: skip
    assert time.monotonic() - started < 20
