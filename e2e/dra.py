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
from e2e.kubelet.dra import DEVICE_CLASS


@contextlib.asynccontextmanager
async def added_node(cluster: LoopbackCluster, name: str, gpu_mode: GpuMode, gpus: int = 2) -> AsyncIterator[NodeInfo]:
    """A Node added to the session's cluster for one test, lost afterwards (its Pods die with it)."""
    node = await cluster.kubelet.add_node(name, gpus=gpus, gpu_mode=gpu_mode)
    try:
        yield node
    finally:
        await cluster.kubelet.lose_node(name)


async def create_claim_template(api: client.ApiClient, namespace: str, name: str, gpus: int) -> None:
    """A ResourceClaimTemplate for `gpus` GPUs of class `gpu.nvidia.com`, in one request named `gpus`."""
    request = {"name": "gpus", "exactly": {"deviceClassName": DEVICE_CLASS, "count": gpus}}
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
