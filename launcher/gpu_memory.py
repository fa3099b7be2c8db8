"""Free and total memory of an instance's GPUs, measured in a throw-away subprocess.

The launcher forks instances, so it must never initialise CUDA itself (a forked CUDA context is
unusable); KAITO measures the same way, and unlike NVML this also works under MIG.
"""

import asyncio
import json
import logging
import os
import subprocess
import sys

from .engine_defaults import GpuMemory

log = logging.getLogger(__name__)

PROBE = "import json, torch\nprint(json.dumps([torch.cuda.mem_get_info(i) for i in range(torch.cuda.device_count())]))"
TIMEOUT_S = 120.0


def parse(stdout: str) -> list[GpuMemory] | None:
    try:
        pairs = json.loads(stdout.strip().splitlines()[-1])
        return [GpuMemory(free_bytes=int(free), total_bytes=int(total)) for free, total in pairs] or None
    except (ValueError, IndexError, TypeError):
        return None


async def measure(cuda_visible_devices: str | None, command: list[str] | None = None) -> list[GpuMemory] | None:
    """The GPUs an instance with this CUDA_VISIBLE_DEVICES would see; None when that cannot be told.

    The exit status is not used: the launcher reaps every child itself (it is a subreaper), so the
    subprocess module may not see it. The printed result is what counts.
    """
    env = dict(os.environ)
    if cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    argv = command or [sys.executable, "-c", PROBE]
    try:
        done = await asyncio.to_thread(
            subprocess.run, argv, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        log.warning("cannot measure GPU memory: %s", err)
        return None
    gpus = parse(done.stdout)
    if gpus is None:
        log.warning("cannot measure GPU memory: %s", (done.stderr or done.stdout).strip()[-300:])
    return gpus
