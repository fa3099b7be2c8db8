"""Render the project's Helm chart with the project's helm (for generators and tests)."""

import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from e2e.chart import CHART, helm_env
from e2e.cluster.binaries import venv_tool

REPO = Path(__file__).resolve().parents[1]
Obj = dict[str, Any]


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    """Run helm with its state in a throwaway home, so nothing of the user's is read or written."""
    with tempfile.TemporaryDirectory() as home:
        return subprocess.run(
            [str(venv_tool("helm")), *args], env=helm_env(Path(home)), capture_output=True, text=True, check=False
        )


def helm(*args: str) -> str:
    done = run_helm(*args)
    if done.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)} failed: {done.stderr}")
    return done.stdout


def render_chart(release: str, namespace: str, *values: str, kube_version: str | None = None) -> list[Obj]:
    """The chart's objects (CRDs included) for these `--set` values."""
    args = ["template", release, str(CHART), "--namespace", namespace, "--include-crds"]
    if kube_version:
        args += ["--kube-version", kube_version]
    out = helm(*args, *(f"--set={v}" for v in values))
    return [doc for doc in yaml.safe_load_all(out) if doc]
