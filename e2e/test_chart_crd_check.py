"""The chart's pre-install check of CRDs already in the cluster (issue 13 item 5): Helm skips crds/ where a CRD of
that name exists, so installing over FMA's CRDs would leave ours out and the API server would silently drop
`sleeperBudget`, `loraAdapters` and `enhancedNodeSelector.draDevices`; the install is refused instead, saying
what to do."""

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from api.crdgen import DEFAULT_OUT_DIR as CRD_DIR
from e2e.chart import helm
from e2e.cluster.cluster import LoopbackCluster
from e2e.crds import kubectl
from e2e.waiting import wait_for
from scripts.helm_chart import CHART

# The CRD (its file, name and kind) and the path under spec of the field only we have.
OUR_FIELDS = (
    ("fma.llm-d.ai_launcherconfigs.yaml", "launcherconfigs.fma.llm-d.ai", "launcherconfig", ("sleeperBudget",)),
    (
        "fma.llm-d.ai_inferenceserverconfigs.yaml",
        "inferenceserverconfigs.fma.llm-d.ai",
        "inferenceserverconfig",
        ("loraAdapters",),
    ),
    (
        "fma.llm-d.ai_launcherpopulationpolicies.yaml",
        "launcherpopulationpolicies.fma.llm-d.ai",
        "launcherpopulationpolicy",
        ("enhancedNodeSelector", "draDevices"),
    ),
)


def _parent(spec: Any, path: tuple[str, ...]) -> Any:
    """The `properties` holding the last field of `path`, from a spec's schema (either client's shape)."""
    for field in path[:-1]:
        spec = spec["properties"][field] if isinstance(spec, dict) else spec.properties[field]
    return spec["properties"] if isinstance(spec, dict) else spec.properties


def without_our_fields() -> str:
    """Our CRDs as FMA 0.6 ships them as far as the check can tell: without the fields only we have."""
    documents = []
    for file, _, _, path in OUR_FIELDS:
        crd: dict[str, Any] = yaml.safe_load((CRD_DIR / file).read_text())
        for version in crd["spec"]["versions"]:
            del _parent(version["schema"]["openAPIV3Schema"]["properties"]["spec"], path)[path[-1]]
        version_columns = [c for c in crd["spec"]["versions"][0].get("additionalPrinterColumns", [])
                           if path[-1] not in c["jsonPath"]]  # fmt: skip
        crd["spec"]["versions"][0]["additionalPrinterColumns"] = version_columns
        documents.append(yaml.safe_dump(crd))
    return "---\n".join(documents)


async def established(api: client.ApiClient, field_present: bool) -> None:
    extensions = client.ApiextensionsV1Api(api)

    async def done() -> bool:
        for _, name, _, path in OUR_FIELDS:
            crd = await extensions.read_custom_resource_definition(name)
            spec = crd.spec.versions[0].schema.open_apiv3_schema.properties["spec"]
            conditions = {c.type: c.status for c in crd.status.conditions or []}
            if (path[-1] in _parent(spec, path)) != field_present or conditions.get("Established") != "True":
                return False
        return True

    await wait_for(done, what="the CRDs replaced", within=30)


@pytest.fixture
async def fma_crds(cluster: LoopbackCluster, api: client.ApiClient, crds: None) -> AsyncIterator[None]:
    """FMA-shaped CRDs in place of ours for one test; ours are put back afterwards."""
    try:
        await kubectl(cluster, "apply", "-f", "-", stdin=without_our_fields())
        await established(api, field_present=False)
        yield
    finally:
        await kubectl(cluster, "apply", "-f", str(CRD_DIR))
        await established(api, field_present=True)
        await published(cluster)


async def published(cluster: LoopbackCluster) -> None:
    """Until the API server's OpenAPI document, which kubectl validates manifests with, has our fields again: it
    follows a CRD change a few seconds later, and a test applying a LauncherConfig next would be refused."""

    async def explained() -> bool:
        fields = [f"{kind}.spec.{'.'.join(path)}" for _, _, kind, path in OUR_FIELDS]
        return all(["FIELD" in await kubectl(cluster, "explain", path, check=False) for path in fields])

    await wait_for(explained, what="our fields in the published OpenAPI", within=60)


async def dry_run_install(cluster: LoopbackCluster, work_dir: Path, namespace: str, *settings: str) -> str:
    return await helm(cluster, work_dir, "install", "dualpods", str(CHART), "-n", namespace, "--dry-run=server",
                      *(f"--set={s}" for s in settings))  # fmt: skip


async def test_installing_over_our_own_crds_passes_the_check(
    cluster: LoopbackCluster, crds: None, namespace: str, tmp_path: Path
) -> None:
    assert "kind: Deployment" in await dry_run_install(cluster, tmp_path, namespace)


async def test_installing_over_crds_without_our_fields_is_refused_with_what_to_do(
    cluster: LoopbackCluster, fma_crds: None, namespace: str, tmp_path: Path
) -> None:
    with pytest.raises(RuntimeError) as refused:
        await dry_run_install(cluster, tmp_path, namespace)
    message = str(refused.value)
    assert "launcherconfigs.fma.llm-d.ai (spec.sleeperBudget)" in message
    assert "inferenceserverconfigs.fma.llm-d.ai (spec.loraAdapters)" in message
    assert "launcherpopulationpolicies.fma.llm-d.ai (spec.enhancedNodeSelector.draDevices)" in message
    assert "kubectl apply --server-side" in message
    assert "kind: Deployment" in await dry_run_install(cluster, tmp_path, namespace, "crds.checkInstalled=false")
