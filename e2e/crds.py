"""Installing the generated CRDs into the loopback cluster, as a user would (`kubectl apply`), and the manifests
of our kinds that tests apply: FMA's e2e objects (e2e/fixture_manifests/) and the GPU deployment users start
from (config/examples/)."""

import asyncio
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client

from api.crdgen import DEFAULT_OUT_DIR as CRD_DIR
from api.crds import API_VERSION, KINDS
from e2e.cluster.binaries import venv_tool
from e2e.cluster.cluster import LoopbackCluster
from e2e.waiting import wait_for


async def kubectl(cluster: LoopbackCluster, *args: str, stdin: str = "", check: bool = True) -> str:
    """kubectl's output; AssertionError when it fails, unless `check` is False (`auth can-i` says no by failing)."""
    process = await asyncio.create_subprocess_exec(
        str(venv_tool("kubectl")),
        "--kubeconfig",
        str(cluster.kubeconfig),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate(stdin.encode())
    assert process.returncode == 0 or not check, f"kubectl {' '.join(args)} failed: {err.decode()}"
    return out.decode()


REPO = CRD_DIR.parent.parent
FIXTURES = REPO / "e2e" / "fixture_manifests"
EXAMPLES = REPO / "config" / "examples"


def manifests(directory: Path, *, ours: bool = True) -> list[dict[str, Any]]:
    """The objects of the YAML files in `directory`: of our three kinds, or (`ours` False) all the others."""
    docs = (doc for path in sorted(directory.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()))
    return [doc for doc in docs if doc and (doc["apiVersion"] == API_VERSION) == ours]


_INSTALLED: set[Path] = set()  # the clusters (by kubeconfig) this process has installed them in


async def install_crds(cluster: LoopbackCluster, api: client.ApiClient) -> None:
    """The CRDs of config/crd/, applied (idempotently) and Established; once per cluster and process
    (CRDs are cluster-wide and nothing here deletes them)."""
    if cluster.kubeconfig in _INSTALLED:
        return
    # Client-side apply also proves the LauncherConfig CRD fits its last-applied annotation (256 KiB).
    await kubectl(cluster, "apply", "-f", str(CRD_DIR))
    extensions = client.ApiextensionsV1Api(api)

    async def established() -> bool:
        for kind in KINDS:
            crd = await extensions.read_custom_resource_definition(kind.RESOURCE.crd_name)
            conditions = {c.type: c.status for c in crd.status.conditions or []}
            if conditions.get("Established") != "True" or conditions.get("NonStructuralSchema") == "True":
                return False
        return True

    await wait_for(established, what="the three CRDs Established", within=30)
    _INSTALLED.add(cluster.kubeconfig)
