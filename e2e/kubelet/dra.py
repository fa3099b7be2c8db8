"""The loopback kubelet as NVIDIA's GPU DRA driver (`gpu.nvidia.com`) for a Node's simulated GPUs.

The real scheduler allocates ResourceClaims from ResourceSlices alone (no kubelet plugin socket is involved,
as KWOK shows): this module publishes NVIDIA's DeviceClass and one ResourceSlice per DRA Node, shaped as
NVIDIA's driver publishes them, and at Pod start resolves a Pod's allocated claims into the devices of each
container, as the kubelet's DRA manager and the driver's NodePrepareResources do. Allocation, `reservedFor`
and deallocation belong to the scheduler and the controller-manager. Facts: shared/reference/dra-cdi.md §1-§4.
"""

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger(__name__)

DRIVER = "gpu.nvidia.com"
DEVICE_CLASS = "gpu.nvidia.com"
API_VERSION = "resource.k8s.io/v1"
# What the simulated GPUs claim to be (NVIDIA's attribute names; `index` and `minor` are no longer published).
PRODUCT_NAME = "NVIDIA H100 80GB HBM3"
MEMORY_BYTES = 80 * 1024**3
_CLAIM_POLL_SECONDS = 0.2

Obj = dict[str, Any]


def device_name(index: int) -> str:
    """NVIDIA's name for a full GPU: `gpu-<minor>`."""
    return f"gpu-{index}"


def device_index(name: str) -> int:
    """The GPU a device name of `device_name` stands for."""
    return int(name.removeprefix("gpu-"))


def device_class() -> Obj:
    """NVIDIA's `gpu.nvidia.com` class: full GPUs of its driver."""
    expression = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'"
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def _device(index: int, uuid: str) -> Obj:
    return {
        "name": device_name(index),
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": uuid},
            "productName": {"string": PRODUCT_NAME},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Hopper"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "580.95.5"},
            "cudaDriverVersion": {"version": "13.0.0"},
        },
        "capacity": {"memory": {"value": str(MEMORY_BYTES)}},
    }


def resource_slice(node: str, node_uid: str, uuids: list[str]) -> Obj:
    """The one slice of `node`'s pool (named after the Node), owned by the Node so that it goes with it."""
    owner = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node}-{DRIVER}-", "ownerReferences": [owner]},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
            "devices": [_device(i, u) for i, u in enumerate(uuids)],
        },
    }


async def publish(api: client.ApiClient, node: str, uuids: list[str]) -> None:
    """The DeviceClass (when absent) and `node`'s slice, replacing any left by an earlier kubelet."""
    resource = client.ResourceV1Api(api)
    try:
        await resource.create_device_class(device_class())
    except ApiException as error:
        if error.status != 409:
            raise
    node_uid = (await client.CoreV1Api(api).read_node(node)).metadata.uid
    await resource.delete_collection_resource_slice(field_selector=f"spec.nodeName={node}")
    await resource.create_resource_slice(resource_slice(node, node_uid, uuids))
    log.info("published the %s ResourceSlice of %s with %d GPUs", DRIVER, node, len(uuids))


def claim_names(pod: client.V1Pod) -> dict[str, str | None]:
    """The Pod's claims by their name in the Pod -> the ResourceClaim's name (None: not generated yet)."""
    generated = {s.name: s.resource_claim_name for s in (pod.status and pod.status.resource_claim_statuses) or []}
    return {ref.name: ref.resource_claim_name or generated.get(ref.name) for ref in pod.spec.resource_claims or []}


def usable(claim: client.ResourceV1ResourceClaim, pod_uid: str) -> bool:
    """Allocated and reserved for this Pod: a kubelet refuses to start a Pod the claim is not reserved for."""
    status = claim.status
    return bool(status and status.allocation and any(r.uid == pod_uid for r in status.reserved_for or []))


def container_devices(pod: client.V1Pod, claims: dict[str, Any], node: str) -> dict[str, list[str]]:
    """Container name -> the names of this driver's devices in `node`'s pool allocated to it. A container's
    claim reference without `request` gets every result of the claim, with one those of that request (or of
    its `firstAvailable` subrequests, `request/sub`)."""
    devices: dict[str, list[str]] = {}
    for container in [*(pod.spec.init_containers or []), *pod.spec.containers]:
        for ref in (container.resources and container.resources.claims) or []:
            allocation = claims[ref.name].status.allocation
            for result in allocation.devices.results or []:
                request = result.request
                wanted = not ref.request or request == ref.request or request.startswith(f"{ref.request}/")
                if wanted and result.driver == DRIVER and result.pool == node:
                    devices.setdefault(container.name, []).append(result.device)
    return devices


async def allocated_devices(
    resource: client.ResourceV1Api, current: Callable[[], client.V1Pod], node: str
) -> dict[str, list[str]]:
    """Wait until every claim of the Pod (`current()`: its newest version) is allocated and reserved for it,
    then its devices per container (see `container_devices`)."""
    while True:
        pod = current()
        names = claim_names(pod)
        if None not in names.values():
            try:
                claims = {
                    ref: await resource.read_namespaced_resource_claim(name, pod.metadata.namespace)
                    for ref, name in names.items()
                }
            except ApiException as error:
                if error.status != 404:
                    raise
            else:
                if all(usable(c, pod.metadata.uid) for c in claims.values()):
                    return container_devices(pod, claims, node)
        await asyncio.sleep(_CLAIM_POLL_SECONDS)
