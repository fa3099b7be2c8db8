"""Where containers' output goes: `<state>/logs/<namespace>_<pod>_<uid>/<container>/<restart>.log`, as in
/var/log/pods on a real node. Read by tests (the API server cannot proxy `kubectl logs` to us)."""

from pathlib import Path


def container_log(logs_dir: Path, namespace: str, pod: str, uid: str, container: str, restart: int) -> Path:
    return logs_dir / f"{namespace}_{pod}_{uid}" / container / f"{restart}.log"


def read_container_log(
    logs_dir: Path, namespace: str, pod: str, uid: str, container: str, *, previous: bool = False
) -> str:
    """The current (or previous) run's output; empty when the container has not run."""
    runs = sorted((logs_dir / f"{namespace}_{pod}_{uid}" / container).glob("*.log"), key=lambda p: int(p.stem))
    index = -2 if previous else -1
    if len(runs) < abs(index):
        return ""
    return runs[index].read_text(errors="replace")
