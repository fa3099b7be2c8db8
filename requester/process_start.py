"""When this process started, in epoch seconds, exact to a clock tick (10 ms).

The requester times its first become-ready from its process start (`dualpods_requester_first_ready_seconds`,
the e2e's and the demo's "container start -> told ready"). psutil's `create_time()` adds the process's start,
counted in clock ticks since boot, to /proc/stat's boot time, which the kernel gives in whole seconds: the
answer is early by that second's fraction, the same for every process of a boot (0.91 s on the machine where
it was found), so every time measured from it was up to a second long. The boot clock that the start is
counted on gives the process's age instead.
"""

import os
import time
from pathlib import Path

_STARTTIME_FIELD = 19  # field 22 of /proc/<pid>/stat, counted from field 3 (after the command's ")")


def process_start(stat: Path = Path("/proc/self/stat")) -> float:
    """Epoch seconds at which the process of `stat` started (Linux)."""
    fields = stat.read_text().rpartition(")")[2].split()
    ticks = int(fields[_STARTTIME_FIELD])
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - age
