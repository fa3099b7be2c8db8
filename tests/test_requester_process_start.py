"""The requester's process start time, which its first become-ready is timed from."""

import subprocess
import time
from pathlib import Path

from requester.process_start import process_start

TICK_S = 0.01  # the kernel counts a process's start in clock ticks


def test_a_process_start_is_when_it_was_spawned_to_a_clock_tick() -> None:
    """Not up to a second early, as the boot time in whole seconds that psutil adds to it made it."""
    before = time.time()
    child = subprocess.Popen(["sleep", "5"])
    after = time.time()
    try:
        started = process_start(Path(f"/proc/{child.pid}/stat"))
    finally:
        child.kill()
        child.wait()
    assert before - TICK_S <= started <= after + TICK_S
