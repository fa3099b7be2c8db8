"""A failing e2e test keeps the loopback cluster's logs (`e2e/failure_logs.py`, issue 21 item 2).

The inner tests run under pytester with a stand-in `cluster` fixture: a temporary state directory laid out
like a real loopback cluster's (control-plane and kubelet logs in `<state>/logs/`, container logs in
`<state>/kubelet/logs/<ns>_<pod>_<uid>/<container>/<restart>.log`). Starting a real cluster inside pytester
would take a minute and the machine's root; what is tested here is the hook, which only reads those files.
"""

import os
import time
from pathlib import Path

import pytest

from e2e.failure_logs import FILE_LIMIT_BYTES, SECTION, keep_logs, sanitized

pytest_plugins = ["pytester"]

# The inner session's conftest: the plugin, and a stand-in `cluster` that points at a state directory laid out
# like the real one; `namespace` is the test's own namespace, as the real fixture's value would be.
CONFTEST = '''
"""Stand-in fixtures: a state directory laid out like a loopback cluster's; no cluster is started."""
import os
from pathlib import Path
import pytest

pytest_plugins = ["e2e.failure_logs"]


class StandInCluster:
    def __init__(self, state_dir):
        self.state_dir = state_dir
        self.kubelet_dir = state_dir / "kubelet"


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    state = tmp_path_factory.mktemp("loopback") / "state"
    write(state / "logs" / "kubelet.log", "".join(f"kubelet line {i}\\n" for i in range(100)))
    write(state / "logs" / "kube-apiserver.log", "apiserver started\\n")
    logs = state / "kubelet" / "logs"
    write(logs / "ns-a_dp-dual-pods-controller-5d9-x1_u1" / "controller" / "0.log", "first run\\n")
    write(logs / "ns-a_dp-dual-pods-controller-5d9-x1_u1" / "controller" / "1.log", "reconciled requester r1\\n")
    write(logs / "ns-a_launcher-abc_u2" / "launcher" / "0.log", "launcher serving\\n")
    old = write(logs / "ns-old_launcher-old_u3" / "launcher" / "0.log", "an earlier test's launcher\\n")
    os.utime(old, (1, 1))
    return StandInCluster(state)


@pytest.fixture
def namespace(cluster):
    return "ns-a"
'''

INNER_TESTS = """
import pytest

def test_fails_in_namespace(cluster, namespace):
    assert 1 == 2, "on purpose"

def test_fails_without_namespace(cluster):
    (cluster.kubelet_dir / "logs" / "ns-b_requester-q_u4" / "req" / "0.log").parent.mkdir(parents=True)
    (cluster.kubelet_dir / "logs" / "ns-b_requester-q_u4" / "req" / "0.log").write_text("requester up\\n")
    assert False, "on purpose"

def test_passes(cluster, namespace):
    pass

def test_fails_without_cluster():
    assert False

@pytest.fixture
def broken_teardown(cluster):
    yield
    raise RuntimeError("teardown on purpose")

def test_fails_in_teardown(broken_teardown):
    pass
"""


@pytest.fixture
def outcome(pytester: pytest.Pytester) -> pytest.RunResult:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_inner=INNER_TESTS)
    # Left over from an "earlier run": removed when the session starts.
    stale = pytester.path / "build" / "e2e-logs" / "stale"
    stale.mkdir(parents=True)
    (pytester.path / "build" / "other.txt").write_text("not ours")
    # Without pytest-asyncio, and so without looptime, whose fixture hook reads pytest-asyncio's event loops.
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:asyncio", "-p", "no:looptime_plugin", "-rf")


def test_a_failing_test_keeps_its_namespaces_logs_and_the_cluster_logs(
    outcome: pytest.RunResult, pytester: pytest.Pytester
) -> None:
    outcome.assert_outcomes(passed=2, failed=3, errors=1)
    kept = pytester.path / "build" / "e2e-logs" / "test_inner.py_test_fails_in_namespace"
    assert (kept / "cluster" / "kubelet.log").read_text().endswith("kubelet line 99\n")
    assert (kept / "cluster" / "kube-apiserver.log").is_file()
    containers = kept / "containers"
    assert sorted(str(p.relative_to(containers)) for p in containers.rglob("*.log")) == [
        "ns-a_dp-dual-pods-controller-5d9-x1_u1/controller/0.log",
        "ns-a_dp-dual-pods-controller-5d9-x1_u1/controller/1.log",
        "ns-a_launcher-abc_u2/launcher/0.log",
    ]
    index = (kept / "index.txt").read_text()
    assert "failed in: call" in index
    assert "namespace(s) ns-a" in index
    assert "containers/ns-a_launcher-abc_u2/launcher/0.log" in index
    # The earlier run's results are gone; nothing else under build/ is touched.
    assert not (pytester.path / "build" / "e2e-logs" / "stale").exists()
    assert (pytester.path / "build" / "other.txt").is_file()
    # Passing tests and tests without the cluster keep nothing.
    assert sorted(p.name for p in (pytester.path / "build" / "e2e-logs").iterdir()) == [
        "test_inner.py_test_fails_in_namespace",
        "test_inner.py_test_fails_in_teardown",
        "test_inner.py_test_fails_without_namespace",
    ]


def test_without_a_namespace_the_logs_written_during_the_test_are_kept(
    outcome: pytest.RunResult, pytester: pytest.Pytester
) -> None:
    kept = pytester.path / "build" / "e2e-logs" / "test_inner.py_test_fails_without_namespace" / "containers"
    logs = {str(p.relative_to(kept)) for p in kept.rglob("*.log")}
    assert "ns-b_requester-q_u4/req/0.log" in logs
    assert "ns-old_launcher-old_u3/launcher/0.log" not in logs


def test_a_teardown_failure_keeps_the_logs_too(outcome: pytest.RunResult, pytester: pytest.Pytester) -> None:
    index = pytester.path / "build" / "e2e-logs" / "test_inner.py_test_fails_in_teardown" / "index.txt"
    assert "failed in: teardown" in index.read_text()


def test_the_report_shows_where_and_the_controllers_and_kubelets_last_lines(outcome: pytest.RunResult) -> None:
    output = outcome.stdout.str()
    assert f"- {SECTION} -" in output
    assert "test_inner.py_test_fails_in_namespace (index.txt lists them)" in output
    # The controller's last run, not its first, and the kubelet's last 40 lines.
    assert "container ns-a_dp-dual-pods-controller-5d9-x1_u1/controller/1.log, last 40 lines" in output
    assert "reconciled requester r1" in output
    assert "kubelet line 99" in output
    assert "kubelet line 60" in output
    assert "kubelet line 59\n" not in output
    assert "launcher serving" not in output  # launchers are in the files, not the report


def test_large_logs_keep_their_last_bytes(tmp_path: Path) -> None:
    class Cluster:
        state_dir = tmp_path / "state"
        kubelet_dir = tmp_path / "state" / "kubelet"

    big = Cluster.state_dir / "logs" / "kube-apiserver.log"
    big.parent.mkdir(parents=True)
    line = "x" * 99 + "\n"
    big.write_text(line * (FILE_LIMIT_BYTES // 100 + 1000) + "the end\n")
    text = keep_logs(Cluster(), tmp_path / "kept", test="t", phase="call", namespaces=[], since=time.time())
    copied = (tmp_path / "kept" / "cluster" / "kube-apiserver.log").read_text()
    assert copied.startswith("[... the first ")
    assert copied.endswith(line + "the end\n")
    assert len(copied) <= FILE_LIMIT_BYTES + 100
    assert "its last" in (tmp_path / "kept" / "index.txt").read_text()
    assert "kubelet log, last 40 lines ---\n(empty or missing)" in text
    assert "(no dual-pods-controller or launcher-populator Pod among" in text
    assert os.path.getsize(big) > FILE_LIMIT_BYTES


def test_sanitized_node_ids() -> None:
    assert sanitized("e2e/test_x.py::test_y[a b/c]") == "e2e_test_x.py_test_y_a_b_c"
    long = sanitized("e2e/t.py::test_" + "z" * 300)
    assert len(long) == 120 + 9
    assert long != sanitized("e2e/t.py::test_" + "z" * 301)
