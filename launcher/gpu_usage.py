"""GPU memory each process uses, from NVML, for the instances' detailed state (and E3 budgets).

NVML is initialised once; on a machine without it (CPU-only, or the loopback cluster) the usage is
unknown (None), never an error.
"""

import logging

log = logging.getLogger(__name__)

_available: bool | None = None


def _nvml() -> bool:
    global _available
    if _available is None:
        try:
            import pynvml

            pynvml.nvmlInit()
            _available = True
        except Exception as err:  # no driver, no library: GPU usage is simply unknown
            log.debug("NVML not available: %s", err)
            _available = False
    return _available


def gpu_memory_by_pid() -> dict[int, int] | None:
    """Bytes of GPU memory per process, summed over all GPUs; None without NVML."""
    if not _nvml():
        return None
    import pynvml

    usage: dict[int, int] = {}
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                usage[process.pid] = usage.get(process.pid, 0) + int(process.usedGpuMemory or 0)
    except pynvml.NVMLError as err:
        log.warning("cannot read GPU memory per process: %s", err)
        return None
    return usage
