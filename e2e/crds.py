"""Installing the generated CRDs into the loopback cluster, as a user would (`kubectl apply`), and the manifests
of our kinds that tests apply: FMA's e2e objects (e2e/fixture_manifests/) and the GPU deployment users start
from (config/examples/)."""

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from api.crdgen import DEFAULT_OUT_DIR as CRD_DIR
from api.crds import (
    API_VERSION,
    GROUP,
    KINDS,
    VALIDATIONS,
    VERSION,
    CustomResource,
    InferenceServerConfig,
    LauncherConfig,
)
from e2e.cluster.cluster import LoopbackCluster
from e2e.waiting import wait_for
from scripts.venv_tools import venv_tool


async def kubectl(cluster: LoopbackCluster, *args: str, stdin: str = "", check: bool = True) -> str:
    """kubectl's output; AssertionError when it fails, unless `check` is False (`auth can-i` says no by failing)."""
    code, out, err = await run_kubectl(cluster, *args, stdin=stdin)
    assert code == 0 or not check, f"kubectl {' '.join(args)} failed: {err}"
    return out


async def kubectl_refused(cluster: LoopbackCluster, *args: str, stdin: str = "") -> str:
    """What kubectl says on standard error when it fails; AssertionError when it succeeds."""
    code, out, err = await run_kubectl(cluster, *args, stdin=stdin)
    assert code != 0, f"kubectl {' '.join(args)} succeeded: {out}"
    return err


async def run_kubectl(cluster: LoopbackCluster, *args: str, stdin: str = "") -> tuple[int, str, str]:
    """kubectl as the cluster's admin: its exit code, standard output and standard error. The kubeconfig is
    in KUBECONFIG (kubectl refuses flags before a plugin's name), and plugins are looked up where the venv
    installed them (`kubectl dualpods`), as in a shell with the venv active."""
    kubectl = venv_tool("kubectl")
    path = os.pathsep.join((str(kubectl.parent), os.environ.get("PATH", "")))
    process = await asyncio.create_subprocess_exec(
        str(kubectl),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PATH": path, "KUBECONFIG": str(cluster.kubeconfig)},
    )
    out, err = await process.communicate(stdin.encode())
    return int(process.returncode or 0), out.decode(), err.decode()


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


# An object of each kind that only the CRD's validation rules refuse: a dry run of it tells which schema is served.
_RULE_BREAKERS: dict[type[CustomResource], dict[str, Any]] = {
    InferenceServerConfig: {
        "launcherConfigName": "lc",
        "modelServerConfig": {"port": 8005, "labels": {"k8s.io/x": ""}},
    },
    LauncherConfig: {"maxInstances": 1, "podTemplate": {"spec": {"containers": [{"name": "other", "image": "x"}]}}},
}


def _without_rules(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _without_rules(v) for k, v in schema.items() if k != VALIDATIONS}
    if isinstance(schema, list):
        return [_without_rules(item) for item in schema]
    return schema


@asynccontextmanager
async def rules_lifted(
    cluster: LoopbackCluster, api: client.ApiClient, kind: type[CustomResource]
) -> AsyncIterator[None]:
    """The CRD of `kind` as the releases before its validation rules had it, to store an object the rules refuse
    (what an upgrade finds in a cluster); the current CRD again afterwards."""
    crd_file = CRD_DIR / f"{GROUP}_{kind.RESOURCE.plural}.yaml"
    old = _without_rules(yaml.safe_load(crd_file.read_text()))
    await kubectl(cluster, "apply", "-f", "-", stdin=yaml.safe_dump(old))
    try:
        await _wait_rules(api, kind, present=False)
        yield
    finally:
        await kubectl(cluster, "apply", "-f", str(crd_file))
        await _wait_rules(api, kind, present=True)


async def _wait_rules(api: client.ApiClient, kind: type[CustomResource], *, present: bool) -> None:
    custom = client.CustomObjectsApi(api)
    probe = {"apiVersion": API_VERSION, "kind": kind.RESOURCE.kind, "metadata": {"name": "probe"},
             "spec": _RULE_BREAKERS[kind]}  # fmt: skip

    async def served() -> bool:
        try:
            await custom.create_namespaced_custom_object(
                GROUP, VERSION, "default", kind.RESOURCE.plural, probe, dry_run="All"
            )
        except ApiException as error:
            return present and error.status == 422
        return not present

    await wait_for(served, what=f"the {kind.RESOURCE.kind} CRD served {'with' if present else 'without'} its rules")
