"""`make cluster-up` / `make cluster-down`, as a user runs them (in a temporary state directory, so a
cluster the developer keeps in `.cluster` is left alone)."""

import json
import subprocess
from pathlib import Path

import psutil
import yaml

from e2e.cluster.binaries import REPO_ROOT
from scripts.venv_tools import venv_tool


def make(*args: str) -> subprocess.CompletedProcess[str]:
    # `-o .venv/.installed`: the venv is what this very test runs in; do not reinstall it mid-run.
    return subprocess.run(
        ["make", "-o", ".venv/.installed", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_make_cluster_up_and_down_leave_nothing_behind(tmp_path: Path) -> None:
    state = tmp_path / "cluster"
    kubectl = [str(venv_tool("kubectl")), "--kubeconfig", str(state / "kubeconfig")]
    pids: dict[str, int] = {}
    up = make("cluster-up", f"CLUSTER_STATE={state}")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        nodes = subprocess.run([*kubectl, "get", "nodes", "-o", "json"], capture_output=True, text=True, check=True)
        listed = {n["metadata"]["name"]: n for n in json.loads(nodes.stdout)["items"]}
        assert sorted(listed) == ["gpu-node-1", "gpu-node-2"]
        for node in listed.values():
            ready = [c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready"]
            assert ready == ["True"]
            assert node["status"]["allocatable"]["nvidia.com/gpu"] == "2"

        again = make("cluster-up", f"CLUSTER_STATE={state}")
        assert again.returncode == 0, again.stdout + again.stderr
        assert "already up" in again.stdout

        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "sleeper", "namespace": "default"},
            "spec": {"containers": [{"name": "s", "image": "python", "command": ["sleep", "600"]}]},
        }
        subprocess.run(
            [*kubectl, "apply", "-f", "-"], input=yaml.safe_dump(pod), text=True, check=True, capture_output=True
        )
        subprocess.run(
            [*kubectl, "wait", "--for=condition=Ready", "pod/sleeper", "--timeout=60s"], check=True, capture_output=True
        )
        status = json.loads(
            subprocess.run(
                [*kubectl, "get", "pod", "sleeper", "-o", "json"], capture_output=True, text=True, check=True
            ).stdout
        )
        container_pid = int(status["status"]["containerStatuses"][0]["containerID"].removeprefix("loopback://"))
        records = [json.loads(p.read_text()) for p in (state / "processes").glob("*.json")]
        pids = {r["name"]: r["pid"] for r in records} | {"container": container_pid}
        assert set(pids) == {
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kubelet",
            "container",
        }
        assert all(psutil.pid_exists(pid) for pid in pids.values())
    finally:
        down = make("cluster-down", f"CLUSTER_STATE={state}")
    assert down.returncode == 0, down.stdout + down.stderr
    assert not [name for name, pid in pids.items() if psutil.pid_exists(pid)], "processes left behind"
    assert not state.exists()
    assert make("cluster-down", f"CLUSTER_STATE={state}").returncode == 0, "cluster-down is idempotent"
