"""pytest plugin (loaded by the root conftest.py): a failing e2e test keeps the loopback cluster's logs.

The session's cluster lives in a temporary state directory that is removed when the session ends, so the
output that explains a failure (the kubelet's, the control plane's, and the containers' of the controllers,
launchers and requesters, which all run as Pods) would be lost, and CI would show only the assertion. When
a test that used the `cluster` fixture fails (setup, call or teardown), this plugin copies into
`build/e2e-logs/<sanitized node id>/`:

    cluster/<name>.log        the control plane's and the kubelet's logs (`<state>/logs/*.log`)
    kubelet/<name>.log        the kubelet's other logs (`<state>/kubelet/*.log`, e.g. simulation processes')
    containers/<ns>_<pod>_<uid>/<container>/<restart>.log
                              the test's container logs: those of its `namespace` fixture when it used
                              one, otherwise every container log written since the test started
    index.txt                 what was kept (and what was cut)

Each file is bounded (its last `FILE_LIMIT_BYTES`), and so is the whole copy (`TOTAL_LIMIT_BYTES`). The
failure's report gets a section "e2e logs" with where they are and the last lines of the controllers'
container logs and of the kubelet's log, which pytest prints with the failure. `build/e2e-logs/` is emptied
before the first test of a session that runs e2e tests (a unit-test run leaves an earlier run's logs alone).
"""

import hashlib
import re
import shutil
import time
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pytest

FILE_LIMIT_BYTES = 2 * 1024 * 1024
TOTAL_LIMIT_BYTES = 200 * 1024 * 1024
TAIL_LINES = 40
LOGS_DIR = Path("build") / "e2e-logs"
# Pods of the Helm chart's controllers: `<release>-dual-pods-controller-…`, `<release>-launcher-populator-…`.
CONTROLLER_PODS = ("dual-pods-controller", "launcher-populator")
SECTION = "e2e logs"
_NAME_LIMIT = 120
# Log files' modification times are compared with the test's start, less this (coarse file-system clocks).
_MTIME_SLACK_SECONDS = 1.0

_STARTED = pytest.StashKey[float]()
_CLUSTER = pytest.StashKey["ClusterDirs"]()


class ClusterDirs(Protocol):
    """What the plugin needs of `LoopbackCluster` (so that it neither imports nor starts one)."""

    @property
    def state_dir(self) -> Path: ...

    @property
    def kubelet_dir(self) -> Path: ...


@dataclass
class _Copy:
    """Files copied into `target`, within the total budget; `lines` becomes index.txt."""

    target: Path
    budget: int = TOTAL_LIMIT_BYTES
    lines: list[str] = field(default_factory=list)

    def add(self, source: Path, relative: Path) -> None:
        try:
            size = source.stat().st_size
        except OSError as error:
            self.lines.append(f"{relative}  not read: {error}")
            return
        if self.budget <= 0:
            self.lines.append(f"{relative}  left out ({size} bytes): the copy reached {TOTAL_LIMIT_BYTES} bytes")
            return
        keep = min(size, FILE_LIMIT_BYTES, self.budget)
        destination = self.target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        with source.open("rb") as reader:
            reader.seek(size - keep)
            data = reader.read(keep)
        if keep < size:
            # Start at a whole line, and say what is missing.
            data = data[data.find(b"\n") + 1 :]
            data = f"[... the first {size - len(data)} bytes are left out ...]\n".encode() + data
        destination.write_bytes(data)
        self.budget -= len(data)
        self.lines.append(f"{relative}  {size} bytes" + (f", its last {keep} kept" if keep < size else ""))


def sanitized(node_id: str) -> str:
    """A directory name for a test: its node id with anything but letters, digits, '.', '-' and '_' as '_'."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", node_id).strip("._")
    if len(name) > _NAME_LIMIT:
        name = f"{name[:_NAME_LIMIT]}-{hashlib.sha256(node_id.encode()).hexdigest()[:8]}"
    return name or "test"


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last `lines` lines of a (bounded) file; empty when it cannot be read."""
    try:
        with path.open("rb") as reader:
            size = reader.seek(0, 2)
            reader.seek(max(0, size - 64 * 1024))
            data = reader.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def container_logs(logs_dir: Path, namespaces: Iterable[str], since: float | None) -> list[Path]:
    """`<ns>_<pod>_<uid>/<container>/<restart>.log` files of `namespaces`, or (none given) modified since `since`."""
    wanted = tuple(f"{namespace}_" for namespace in namespaces)
    found = []
    for log in sorted(logs_dir.glob("*/*/*.log")):
        pod_dir = log.parent.parent.name
        if wanted:
            if pod_dir.startswith(wanted):
                found.append(log)
        elif since is not None:
            try:
                if log.stat().st_mtime >= since - _MTIME_SLACK_SECONDS:
                    found.append(log)
            except OSError:
                continue
    return found


def keep_logs(
    cluster: ClusterDirs, target: Path, *, test: str, phase: str, namespaces: list[str], since: float | None
) -> str:
    """Copy the cluster's logs for a failed `test` into `target`; returns the report section's text."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    copy = _Copy(target)
    state = cluster.state_dir
    for log in sorted((state / "logs").glob("*.log")):
        copy.add(log, Path("cluster") / log.name)
    for log in sorted(cluster.kubelet_dir.glob("*.log")):
        copy.add(log, Path("kubelet") / log.name)
    logs_dir = cluster.kubelet_dir / "logs"
    containers = container_logs(logs_dir, namespaces, since)
    for log in containers:
        copy.add(log, Path("containers") / log.relative_to(logs_dir))
    which = f"namespace(s) {', '.join(namespaces)}" if namespaces else "written during the test"
    header = [
        f"test: {test}",
        f"failed in: {phase}",
        f"cluster state: {state}" + ("" if state.is_dir() else " (already removed: nothing to copy)"),
        f"container logs: {which}",
        f"each file: at most its last {FILE_LIMIT_BYTES} bytes",
        "",
    ]
    (target / "index.txt").write_text("\n".join(header + (copy.lines or ["(no log files found)"])) + "\n")

    sections = [f"logs kept in {target} (index.txt lists them)"]
    controllers = _latest_runs(c for c in containers if any(name in c.parent.parent.name for name in CONTROLLER_PODS))
    for log in controllers:
        sections.append(_tail_block(f"container {log.relative_to(logs_dir)}", log))
    if not controllers:
        sections.append(f"(no {' or '.join(CONTROLLER_PODS)} Pod among the test's container logs)")
    sections.append(_tail_block("kubelet log", state / "logs" / "kubelet.log"))
    return "\n\n".join(sections)


def _latest_runs(logs: Iterable[Path]) -> list[Path]:
    """The last restart's log of each container."""
    latest: dict[Path, Path] = {}
    for log in logs:
        current = latest.get(log.parent)
        if not log.stem.isdigit():
            continue
        if current is None or int(log.stem) > int(current.stem):
            latest[log.parent] = log
    return [latest[key] for key in sorted(latest)]


def _tail_block(title: str, log: Path) -> str:
    text = tail(log)
    return f"--- {title}, last {TAIL_LINES} lines ---\n{text if text else '(empty or missing)'}"


def _uses_cluster(item: pytest.Item) -> bool:
    return "cluster" in getattr(item, "fixturenames", ())


def pytest_collection_finish(session: pytest.Session) -> None:
    """An earlier run's logs go before an e2e run starts, so that what is there belongs to this run."""
    if any(_uses_cluster(item) for item in session.items) and not session.config.option.collectonly:
        shutil.rmtree(session.config.rootpath / LOGS_DIR, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_STARTED] = time.time()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    funcargs: dict[str, object] = getattr(item, "funcargs", None) or {}
    found = funcargs.get("cluster")
    if found is not None and hasattr(found, "state_dir") and hasattr(found, "kubelet_dir"):
        item.stash[_CLUSTER] = found
    cluster = item.stash.get(_CLUSTER, None)
    if not report.failed or cluster is None:
        return report
    namespace = funcargs.get("namespace")
    target = item.config.rootpath / LOGS_DIR / sanitized(item.nodeid)
    try:
        text = keep_logs(
            cluster,
            target,
            test=item.nodeid,
            phase=report.when or call.when,
            namespaces=[namespace] if isinstance(namespace, str) else [],
            since=item.stash.get(_STARTED, None),
        )
    except OSError as error:
        text = f"could not keep the logs in {target}: {error}"
    report.sections.append((SECTION, text))
    return report
