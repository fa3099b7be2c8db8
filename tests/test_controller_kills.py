"""The e2e harness's kill of a controller (e2e/chart.py), which the chaos test and the fault soak count
restarts by: one kill is one container's death, never two."""

import subprocess
import sys
import uuid
from pathlib import Path
from typing import cast

import psutil
import pytest
from kubernetes_asyncio import client

from e2e.chart import DUAL_PODS, InstalledControllers
from e2e.cluster.cluster import LoopbackCluster
from tests.processes import children


def _controllers(tmp_path: Path) -> InstalledControllers:
    """A release whose processes are looked up by namespace alone (no cluster is reached here)."""
    namespace = f"kills-{uuid.uuid4().hex[:8]}"
    return InstalledControllers(cast(LoopbackCluster, None), cast(client.ApiClient, None), namespace, tmp_path)


def test_a_fork_with_the_controllers_command_line_is_not_a_second_controller(tmp_path: Path) -> None:
    """A container's setup shell forks each command it runs: until the child's exec, it carries the
    controller's command line too."""
    controllers = _controllers(tmp_path)
    forks = "import os, time\nos.fork()\ntime.sleep(60)"
    parent = subprocess.Popen([sys.executable, "-c", forks, "controller", "dual-pods",
                               f"--namespace={controllers.namespace}"])  # fmt: skip
    forked: list[psutil.Process] = []
    try:
        forked = children(psutil.Process(parent.pid), 1)
        assert [p.pid for p in controllers.processes(DUAL_PODS)] == [parent.pid]
        assert controllers.kill(DUAL_PODS) == 1
        assert parent.wait(10) == -9
    finally:
        parent.kill()
        for child in forked:
            child.kill()


def test_a_process_gone_before_its_signal_is_not_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    listed = psutil.Process(gone.pid)
    gone.wait(10)
    controllers = _controllers(tmp_path)
    monkeypatch.setattr(controllers, "processes", lambda component: [listed])
    assert controllers.kill(DUAL_PODS) == 0, "a caller retrying until a kill must not kill the next run"
