"""Resource use of an instance's process tree, for the detailed instance state."""

import psutil

from api.launcher import ProcessStats


class ProcessTreeStats:
    """Keeps the psutil handles between calls so CPU percentages cover the interval since the last."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._handles: dict[int, psutil.Process] = {}

    def sample(self, gpu_usage: dict[int, int] | None) -> ProcessStats | None:
        """`gpu_usage`: GPU bytes per PID (gpu_usage.gpu_memory_by_pid), None where unknown."""
        try:
            root = psutil.Process(self._pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            return None
        rss = 0
        cpu = 0.0
        handles: dict[int, psutil.Process] = {}
        for process in tree:
            handle = self._handles.get(process.pid, process)
            try:
                rss += handle.memory_info().rss
                cpu += handle.cpu_percent(interval=None)
            except psutil.Error:
                continue
            handles[process.pid] = handle
        self._handles = handles
        return ProcessStats(
            pid=self._pid,
            processes=len(handles),
            rss_bytes=rss,
            cpu_percent=round(cpu, 1),
            gpu_memory_bytes=sum(gpu_usage.get(pid, 0) for pid in handles) if gpu_usage is not None else None,
        )
