"""Render the project's Helm chart with the project's helm (for generators and tests)."""

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from scripts.venv_tools import venv_tool

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "dualpods"
Obj = dict[str, Any]


def helm_env(home: Path) -> dict[str, str]:
    """helm's state (config, cache, plugins) under `home`, so nothing of the user's is read or written."""
    return {**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(home / "cache"),
            "XDG_CONFIG_HOME": str(home / "config"), "XDG_DATA_HOME": str(home / "data")}  # fmt: skip


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
