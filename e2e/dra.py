"""Helpers for the DRA and CDI e2e: an extra Node of a given GPU mode, and ResourceClaimTemplates asking for
GPUs of NVIDIA's DeviceClass as users write them."""

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from kubernetes_asyncio import client

from api.keys import GPU_RESOURCE
from e2e.cluster.cluster import LoopbackCluster
from e2e.kubelet.config import GpuMode
from e2e.kubelet.control import NodeInfo
from e2e.kubelet.dra import DEVICE_CLASS, DRIVER


@contextlib.asynccontextmanager
async def added_node(cluster: LoopbackCluster, name: str, gpu_mode: GpuMode, gpus: int = 2) -> AsyncIterator[NodeInfo]:
    """A Node added to the session's cluster for one test, lost afterwards (its Pods die with it)."""
    node = await cluster.kubelet.add_node(name, gpus=gpus, gpu_mode=gpu_mode)
    try:
        yield node
    finally:
        await cluster.kubelet.lose_node(name)


@contextlib.asynccontextmanager
async def added_nodes(
    cluster: LoopbackCluster, prefix: str, gpu_mode: GpuMode, count: int = 2
) -> AsyncIterator[list[NodeInfo]]:
    """`count` Nodes (`<prefix>-1`, ...) added for one test; request it before `env`, so that the Nodes outlive the
    controllers' teardown of the requesters."""
    async with contextlib.AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(added_node(cluster, f"{prefix}-{i}", gpu_mode)) for i in range(1, count + 1)
        ]


ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
# A LauncherPopulationPolicy's selector of the Nodes NVIDIA's DRA driver publishes GPUs for.
DRA_NODES = {"labelSelector": {}, "draDevices": {DRIVER: {"min": 1}}}


async def allow_admin_access(api: client.ApiClient, namespace: str) -> None:
    """Label `namespace` as a cluster admin does so that claims in it may take devices with admin access."""
    await client.CoreV1Api(api).patch_namespace(namespace, {"metadata": {"labels": {ADMIN_ACCESS_LABEL: "true"}}})


async def create_claim_template(
    api: client.ApiClient, namespace: str, name: str, gpus: int | None, uuid: str | None = None
) -> None:
    """A ResourceClaimTemplate for `gpus` GPUs of class `gpu.nvidia.com`, in one request named `gpus`; `uuid`:
    only the device with that UUID. `gpus` None: every GPU of the Node, with admin access (beside the claims
    that hold them), as a launcher on a DRA Node takes them; the namespace must allow it (`allow_admin_access`)."""
    exactly: dict[str, Any] = {"deviceClassName": DEVICE_CLASS, "count": gpus}
    if uuid is not None:
        exactly["selectors"] = [{"cel": {"expression": f"device.attributes['{DRIVER}'].uuid == '{uuid}'"}}]
    if gpus is None:
        exactly = {"deviceClassName": DEVICE_CLASS, "allocationMode": "All", "adminAccess": True}
    request = {"name": "gpus", "exactly": exactly}
    body = {"metadata": {"name": name}, "spec": {"spec": {"devices": {"requests": [request]}}}}
    await client.ResourceV1Api(api).create_namespaced_resource_claim_template(namespace, body)


def claim_gpus(spec: dict[str, Any], template: str) -> None:
    """Make the Pod spec `spec` ask for its GPUs through one claim made from `template`, shared by its
    containers, instead of `nvidia.com/gpu`."""
    spec["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": template}]
    for container in spec["containers"]:
        resources = container.setdefault("resources", {})
        for kind in ("limits", "requests"):
            (resources.get(kind) or {}).pop(GPU_RESOURCE, None)
        resources["claims"] = [{"name": "gpus"}]
