"""The loopback kubelet as NVIDIA's GPU DRA driver, without a cluster: the objects it publishes, how it maps a
Pod's allocated claims to its containers' devices, the environment the runtime gives GPU containers, and what
the launcher's mock GPUs see under it."""

from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from e2e.kubelet import dra
from e2e.kubelet.cdi import gpu_env
from e2e.kubelet.config import NodeConfig
from e2e.kubelet.gpus import RESOURCE, gpu_uuid
from e2e.kubelet.node import node_status
from launcher import gpus
from launcher.errors import UnknownGpu

_API: list[client.ApiClient] = []


@pytest.fixture(autouse=True)
async def _decoder() -> AsyncIterator[None]:
    """kubernetes-asyncio decodes through an ApiClient, which wants a running event loop."""
    _API.append(client.ApiClient(client.Configuration()))
    yield
    await _API.pop().close()


def _decode(obj: dict[str, Any], kind: str) -> Any:
    return _API[-1]._ApiClient__deserialize(obj, kind)


def test_the_device_class_selects_full_gpus_of_nvidias_driver() -> None:
    body = dra.device_class()
    assert body["metadata"]["name"] == "gpu.nvidia.com"
    expression = body["spec"]["selectors"][0]["cel"]["expression"]
    assert expression == "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"


def test_a_nodes_slice_is_one_complete_pool_named_after_it_owned_by_the_node() -> None:
    uuids = [gpu_uuid("n1", 0), gpu_uuid("n1", 1)]
    body = dra.resource_slice("n1", "uid-1", uuids)
    spec = body["spec"]
    assert (spec["driver"], spec["nodeName"]) == ("gpu.nvidia.com", "n1")
    assert spec["pool"] == {"name": "n1", "generation": 0, "resourceSliceCount": 1}
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-1", "controller": True}
    ]
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    first = spec["devices"][0]
    assert first["attributes"]["uuid"] == {"string": uuids[0]}
    assert first["attributes"]["type"] == {"string": "gpu"}
    assert "productName" in first["attributes"]
    assert not {"index", "minor"} & set(first["attributes"]), "NVIDIA no longer publishes them"
    assert first["capacity"] == {"memory": {"value": str(80 * 1024**3)}}
    assert dra.device_index("gpu-1") == 1


def test_dra_nodes_advertise_no_device_plugin_gpus() -> None:
    assert node_status(NodeConfig(name="a"), "127.0.0.1", "v1.35.4")["allocatable"][RESOURCE] == "2"
    cdi = NodeConfig(name="b", gpu_mode="device-plugin-cdi")
    assert node_status(cdi, "127.0.0.1", "v1.35.4")["allocatable"][RESOURCE] == "2"
    assert RESOURCE not in node_status(NodeConfig(name="c", gpu_mode="dra"), "127.0.0.1", "v1.35.4")["allocatable"]


def _pod(claims: list[dict[str, Any]], containers: list[dict[str, Any]], statuses: list[dict[str, Any]]) -> Any:
    return _decode(
        {
            "metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"},
            "spec": {"resourceClaims": claims, "containers": containers},
            "status": {"resourceClaimStatuses": statuses},
        },
        "V1Pod",
    )


def _claim(results: list[tuple[str, str, str, str]] | None, reserved: list[str]) -> Any:
    status: dict[str, Any] = {"reservedFor": [{"resource": "pods", "name": "p", "uid": u} for u in reserved]}
    if results is not None:
        status["allocation"] = {
            "devices": {"results": [{"request": r, "driver": d, "pool": p, "device": n} for r, d, p, n in results]}
        }
    return _decode({"metadata": {"name": "c"}, "spec": {"devices": {}}, "status": status}, "ResourceV1ResourceClaim")


def test_claim_names_come_from_the_pod_or_the_generated_claims_status() -> None:
    pod = _pod(
        [{"name": "gpus", "resourceClaimTemplateName": "t"}, {"name": "shared", "resourceClaimName": "s"}],
        [{"name": "main"}],
        [],
    )
    assert dra.claim_names(pod) == {"gpus": None, "shared": "s"}
    pod.status = _decode({"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "p-gpus-x"}]}, "V1PodStatus")
    assert dra.claim_names(pod) == {"gpus": "p-gpus-x", "shared": "s"}


def test_a_claim_is_usable_once_allocated_and_reserved_for_this_pod() -> None:
    assert not dra.usable(_claim(None, []), "pod-uid")
    assert not dra.usable(_claim([("gpu", dra.DRIVER, "n1", "gpu-0")], ["other"]), "pod-uid")
    assert dra.usable(_claim([("gpu", dra.DRIVER, "n1", "gpu-0")], ["pod-uid"]), "pod-uid")


def test_each_container_gets_the_results_of_the_requests_it_names() -> None:
    pod = _pod(
        [{"name": "gpus", "resourceClaimTemplateName": "t"}],
        [
            {"name": "all", "resources": {"claims": [{"name": "gpus"}]}},
            {"name": "one", "resources": {"claims": [{"name": "gpus", "request": "big"}]}},
            {"name": "none"},
        ],
        [{"name": "gpus", "resourceClaimName": "c"}],
    )
    claim = _claim(
        [
            ("small", dra.DRIVER, "n1", "gpu-0"),
            ("big/h100", dra.DRIVER, "n1", "gpu-1"),  # a firstAvailable subrequest
            ("big", "other.example.com", "n1", "dev-0"),  # another driver's device
            ("small", dra.DRIVER, "n2", "gpu-3"),  # another Node's pool
        ],
        ["pod-uid"],
    )
    assert dra.container_devices(pod, {"gpus": claim}, "n1") == {"all": ["gpu-0", "gpu-1"], "one": ["gpu-1"]}


def test_cdi_overwrites_the_visible_devices_with_void_and_declares_nvmls_view() -> None:
    assert gpu_env(["GPU-a", "GPU-b"], cdi=False) == {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}
    assert gpu_env(["GPU-a", "GPU-b"], cdi=True) == {
        "NVIDIA_VISIBLE_DEVICES": "void",
        "DUALPODS_SIMULATED_NVML_UUIDS": "GPU-a,GPU-b",
    }
    # A container holding no claim on a DRA-only Node: no CDI edit, and NVML sees nothing.
    assert gpu_env([], cdi=True) == {"DUALPODS_SIMULATED_NVML_UUIDS": ""}


async def test_a_mock_launcher_sees_only_the_gpus_injected_into_its_container() -> None:
    """The launcher's FMA mock mode under the loopback kubelet's CDI stand-in: an admin-access claim for every
    GPU of the Node shows all of them, no claim shows none (its instances then fail on an unknown UUID)."""
    every = gpus.inventory(4, None, None, "GPU-0,GPU-1,GPU-2,GPU-3")
    assert await every.mapping() == {"GPU-0": 0, "GPU-1": 1, "GPU-2": 2, "GPU-3": 3}
    assert await gpus.inventory(4, None, None, "GPU-3,GPU-1").mapping() == {"GPU-1": 0, "GPU-3": 1}
    nothing = gpus.inventory(4, None, None, "")
    with pytest.raises(UnknownGpu, match=r"available .*: none"):
        await nothing.indices(["GPU-0"])
    assert await gpus.inventory(2, None, None).mapping() == {"GPU-0": 0, "GPU-1": 1}, "outside the loopback kubelet"
