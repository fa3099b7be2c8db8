"""The generated CRDs on the loopback cluster's real kube-apiserver: installed with a plain `kubectl apply` as a
user would, Established, enforcing the schema and its validation rules (refused by `kubectl apply` with the field
named; an object stored before a rule existed stays updatable: validation ratcheting), with a working status
subresource."""

import json
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from api import keys
from api.crds import (
    API_VERSION,
    GROUP,
    KINDS,
    VERSION,
    CustomResource,
    InferenceServerConfig,
    LauncherConfig,
    LauncherPopulationPolicy,
    Status,
    parse_object,
)
from e2e.cluster.cluster import LoopbackCluster
from e2e.crds import EXAMPLES, FIXTURES, kubectl, kubectl_refused, manifests, rules_lifted


def examples() -> list[dict[str, Any]]:
    """FMA's e2e objects and the GPU deployment's objects of our kinds."""
    return manifests(FIXTURES) + manifests(EXAMPLES)


async def create(api: client.ApiClient, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """Sent as is (not through the models), so the apiserver's own validation is what answers."""
    plural = next(k for k in KINDS if k.RESOURCE.kind == manifest["kind"]).RESOURCE.plural
    created: dict[str, Any] = await client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, plural, manifest
    )
    return created


async def rejection(api: client.ApiClient, namespace: str, manifest: dict[str, Any]) -> str:
    """The apiserver's message refusing `manifest`."""
    with pytest.raises(ApiException) as caught:
        await create(api, namespace, manifest)
    assert caught.value.status == 422, caught.value.body
    message: str = json.loads(str(caught.value.body))["message"]
    return message


@pytest.mark.usefixtures("crds")
async def test_examples_are_accepted_and_read_back_through_the_models(
    cluster: LoopbackCluster, api: client.ApiClient, namespace: str
) -> None:
    await kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(examples()))
    custom = client.CustomObjectsApi(api)
    for manifest in examples():
        expected = parse_object(manifest)
        if isinstance(expected, LauncherConfig):
            # The one default the schema carries, Kubernetes' own: a container port's protocol.
            for container in expected.spec.pod_template.spec["containers"]:
                for port in container.get("ports", []):
                    port.setdefault("protocol", "TCP")
        stored = await custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, expected.RESOURCE.plural, manifest["metadata"]["name"]
        )
        assert parse_object(stored).spec == expected.spec
    table = await kubectl(cluster, "get", "fma", "-n", namespace, "-o", "wide")
    for header in ("LAUNCHER CONFIG", "PORT", "MAX INSTANCES", "HOST BUDGET", "LAUNCHER CONFIGS"):
        assert header in table, table
    assert "64Gi" in table
    assert "8007" in table


@pytest.mark.usefixtures("crds")
async def test_the_apiserver_enforces_the_schema(api: client.ApiClient, namespace: str) -> None:
    counts = [{"launcherConfigName": "a", "launcherCount": 1}, {"launcherConfigName": "a", "launcherCount": 2}]
    duplicate = {
        "apiVersion": API_VERSION,
        "kind": "LauncherPopulationPolicy",
        "metadata": {"name": "duplicate"},
        "spec": {"enhancedNodeSelector": {"labelSelector": {}}, "countForLauncher": counts},
    }
    assert "spec.countForLauncher[1]: Duplicate value" in await rejection(api, namespace, duplicate)
    port_zero = {
        "apiVersion": API_VERSION,
        "kind": "InferenceServerConfig",
        "metadata": {"name": "port-zero"},
        "spec": {"launcherConfigName": "x", "modelServerConfig": {"port": 0}},
    }
    assert "spec.modelServerConfig.port in body should be greater than or equal to 1" in await rejection(
        api, namespace, port_zero
    )
    budget = {
        "apiVersion": API_VERSION,
        "kind": "LauncherConfig",
        "metadata": {"name": "bad-budget"},
        "spec": {"maxInstances": 0, "sleeperBudget": {"hostMemoryBytes": "-1Gi", "gpuMemoryBytes": "lots"}},
    }
    message = await rejection(api, namespace, budget)
    for field in ("spec.maxInstances", "spec.sleeperBudget.hostMemoryBytes", "spec.sleeperBudget.gpuMemoryBytes"):
        assert field in message, message
    missing = {"apiVersion": API_VERSION, "kind": "LauncherConfig", "metadata": {"name": "x"}, "spec": {}}
    assert "spec.maxInstances: Required value" in await rejection(api, namespace, missing)


async def _replace_status(api: client.ApiClient, namespace: str, resource: CustomResource) -> dict[str, Any]:
    replaced: dict[str, Any] = await client.CustomObjectsApi(api).replace_namespaced_custom_object_status(
        GROUP, VERSION, namespace, resource.RESOURCE.plural, resource.metadata.name, resource.to_k8s()
    )
    return replaced


@pytest.mark.usefixtures("crds")
async def test_status_is_a_subresource(api: client.ApiClient, namespace: str) -> None:
    custom = client.CustomObjectsApi(api)
    manifest = next(d for d in examples() if d["kind"] == "LauncherPopulationPolicy")
    policy = LauncherPopulationPolicy.from_k8s(await create(api, namespace, manifest))
    generation = policy.metadata.generation
    policy.status = Status(observed_generation=generation, errors=['LauncherConfig "cpu-launcher" does not exist'])
    written = LauncherPopulationPolicy.from_k8s(await _replace_status(api, namespace, policy))
    assert written.status == policy.status
    assert written.metadata.generation == generation  # a status write is not a spec change

    # Through the main resource, status is ignored and a spec change bumps the generation.
    written.spec.count_for_launcher[0].launcher_count = 3
    written.status = Status()
    updated = LauncherPopulationPolicy.from_k8s(
        await custom.replace_namespaced_custom_object(
            GROUP, VERSION, namespace, "launcherpopulationpolicies", written.metadata.name, written.to_k8s()
        )
    )
    assert updated.status == policy.status
    assert updated.metadata.generation == generation + 1
    assert updated.spec.count_for_launcher[0].launcher_count == 3

    # Emptied errors disappear with a replace (the models omit empty fields, as Go's omitempty does).
    updated.status = Status(observed_generation=updated.metadata.generation)
    cleared = await _replace_status(api, namespace, updated)
    assert cleared["status"] == {"observedGeneration": generation + 1}


def _isc(name: str, labels: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    server = {"port": 8005, "labels": labels, "annotations": annotations or {}}
    return {"apiVersion": API_VERSION, "kind": "InferenceServerConfig", "metadata": {"name": name},
            "spec": {"launcherConfigName": "lc", "modelServerConfig": server}}  # fmt: skip


async def _refused_apply(cluster: LoopbackCluster, namespace: str, manifest: dict[str, Any]) -> str:
    """What `kubectl apply` says when the API server refuses `manifest`."""
    return await kubectl_refused(cluster, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(manifest))


@pytest.mark.usefixtures("crds")
async def test_kubectl_apply_is_refused_by_the_validation_rules_with_the_field_named(
    cluster: LoopbackCluster, namespace: str
) -> None:
    """What the dual-pods controller would otherwise refuse only at binding time, as a Stalled status."""
    reserved = await _refused_apply(cluster, namespace, _isc("reserved", {f"{keys.PREFIX}pool": "a"}))
    assert (
        f"spec.modelServerConfig.labels: Invalid value: label key {keys.PREFIX}pool uses a reserved prefix" in reserved
    )
    forged = await _refused_apply(cluster, namespace, _isc("forged", {}, {"kubernetes.io/owner": "me"}))
    assert "spec.modelServerConfig.annotations: Invalid value: annotation key kubernetes.io/owner uses" in forged
    malformed = await _refused_apply(cluster, namespace, _isc("malformed", {"bad key!": "a"}))
    assert "spec.modelServerConfig.labels: Invalid value: every label key must be a qualified name" in malformed
    value = await _refused_apply(cluster, namespace, _isc("value", {"pool": "not a label value"}))
    assert "spec.modelServerConfig.labels: Invalid value: every label value must be a valid label value" in value
    no_launcher = {"apiVersion": API_VERSION, "kind": "LauncherConfig", "metadata": {"name": "no-launcher"},
                   "spec": {"maxInstances": 1, "podTemplate": {"spec": {"containers": [{"name": "sidecar",
                                                                                       "image": "x"}]}}}}  # fmt: skip
    missing = await _refused_apply(cluster, namespace, no_launcher)
    assert (
        f"spec.podTemplate.spec.containers: Required value: podTemplate.spec must have a container named "
        f"{keys.INFERENCE_SERVER_CONTAINER}"
    ) in missing
    routed = _isc("routed", {"app.kubernetes.io/name": "pool-a", "node.k8s.io/x": ""}, {"example.com/team": "a"})
    await kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(routed))


@pytest.mark.usefixtures("crds")
async def test_an_object_stored_before_the_rules_stays_updatable(
    cluster: LoopbackCluster, api: client.ApiClient, namespace: str
) -> None:
    """Validation ratcheting (Kubernetes 1.30+): an upgrade that adds rules does not lock users out of their old
    objects; only a change of the offending field must meet the rule."""
    async with rules_lifted(cluster, api, InferenceServerConfig):
        await create(api, namespace, _isc("old", {"kubernetes.io/pool": "a"}))
    custom = client.CustomObjectsApi(api)
    plural = InferenceServerConfig.RESOURCE.plural

    async def patch(server: dict[str, Any]) -> dict[str, Any]:
        body = {"spec": {"modelServerConfig": server}}
        patched: dict[str, Any] = await custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, plural, "old", body, _content_type="application/merge-patch+json"
        )
        return patched

    updated = await patch({"options": "--max-model-len 512"})
    assert updated["spec"]["modelServerConfig"]["labels"] == {"kubernetes.io/pool": "a"}
    with pytest.raises(ApiException) as refused:
        await patch({"labels": {"kubernetes.io/pool": "b"}})
    assert "label key kubernetes.io/pool uses a reserved prefix" in json.loads(str(refused.value.body))["message"]
    fixed = await patch({"labels": {"kubernetes.io/pool": None, "pool": "b"}})
    assert fixed["spec"]["modelServerConfig"]["labels"] == {"pool": "b"}
