"""A fake GPU Node in the API: registration with capacity and Ready conditions, Lease heartbeats, deletion."""

import asyncio
import datetime
import logging
import platform
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from e2e.kubelet.apierrors import API_ERRORS, describe
from e2e.kubelet.config import NodeConfig
from e2e.kubelet.gpus import RESOURCE
from e2e.kubelet.status import now, timestamp
from kube.client import answer_of

log = logging.getLogger(__name__)

LEASE_NAMESPACE = "kube-node-lease"
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
_LEASE_SECONDS = 40


def _micro(when: datetime.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_labels(config: NodeConfig) -> dict[str, str]:
    return {
        "kubernetes.io/hostname": config.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        GPU_PRESENT_LABEL: "true",
        "nvidia.com/gpu.count": str(config.gpus),
    }


def _conditions(stamp: str) -> list[dict[str, str]]:
    def condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp,
        }

    return [
        condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        condition("Ready", "True", "KubeletReady", "loopback kubelet is posting ready status"),
    ]


def node_status(config: NodeConfig, host_ip: str, kubelet_version: str) -> dict[str, Any]:
    """What a kubelet of `kubelet_version` (the control plane's own: a node never runs ahead of it) posts."""
    resources = {
        "cpu": config.cpu,
        "memory": config.memory,
        "pods": str(config.pods),
        "ephemeral-storage": "100Gi",
    }
    if config.gpu_mode != "dra":  # NVIDIA's DRA driver publishes ResourceSlices instead (`dra.py`)
        resources[RESOURCE] = str(config.gpus)
    return {
        "capacity": resources,
        "allocatable": resources,
        "conditions": _conditions(timestamp(now())),
        "addresses": [{"type": "InternalIP", "address": host_ip}, {"type": "Hostname", "address": config.name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        "nodeInfo": {
            "machineID": config.name,
            "systemUUID": config.name,
            "bootID": config.name,
            "kernelVersion": platform.release(),
            "osImage": "dualpods loopback node",
            "containerRuntimeVersion": "loopback://0.1.0",
            "kubeletVersion": kubelet_version,
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
        # What the runtime can do (1.30+): read-only mounts are read-only all the way down (`mount -o
        # bind,ro` in a private namespace), and there are no user namespaces.
        "runtimeHandlers": [{"name": "", "features": {"recursiveReadOnlyMounts": True, "userNamespaces": False}}],
        "features": {"supplementalGroupsPolicy": True},
    }


class NodeRegistration:
    """The Node object and its Lease; the node lifecycle controller reads both to keep the Node Ready."""

    def __init__(
        self,
        api: client.ApiClient,
        config: NodeConfig,
        host_ip: str,
        kubelet_version: str,
        lease_renew_seconds: float,
        status_seconds: float,
    ) -> None:
        self._core = client.CoreV1Api(api)
        self._leases = client.CoordinationV1Api(api)
        self.config = config
        self.host_ip = host_ip
        self.kubelet_version = kubelet_version
        self._renew = lease_renew_seconds
        self._status_every = status_seconds

    async def register(self) -> None:
        """Create the Node (status included, as kubelets do), or take over an existing one of that name."""
        name = self.config.name
        status = node_status(self.config, self.host_ip, self.kubelet_version)
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": node_labels(self.config)},
            "status": status,
        }
        try:
            await self._core.create_node(body)
        except ApiException as error:
            if error.status != 409:
                raise
            await self._core.patch_node(name, {"metadata": {"labels": node_labels(self.config)}})
            await self._core.patch_node_status(name, {"status": status})
        log.info("registered node %s at %s with %d GPUs", name, self.host_ip, self.config.gpus)

    async def heartbeat(self) -> None:
        """Forever: renew the Lease every few seconds and re-post Ready conditions now and then, and at once
        after the API server was unreachable (so the Node turns Ready again without waiting)."""
        loop = asyncio.get_running_loop()
        last_status = loop.time()
        while True:
            try:
                await self._renew_lease()
                if loop.time() - last_status > self._status_every:
                    await self._core.patch_node_status(
                        self.config.name, {"status": {"conditions": _conditions(timestamp(now()))}}
                    )
                    last_status = loop.time()
            except API_ERRORS as error:
                log.warning("heartbeat of %s failed: %s", self.config.name, describe(error))
                last_status = float("-inf")  # post the Ready conditions again as soon as the API server answers
            await asyncio.sleep(self._renew)

    async def _renew_lease(self) -> None:
        name = self.config.name
        spec = {"holderIdentity": name, "leaseDurationSeconds": _LEASE_SECONDS, "renewTime": _micro(now())}
        try:
            await answer_of(
                self._leases.patch_namespaced_lease(name, LEASE_NAMESPACE, {"spec": spec}, _preload_content=False)
            )
        except ApiException as error:
            if error.status != 404:
                raise
            node = await self._core.read_node(name)
            owner = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node.metadata.uid}
            lease = {"metadata": {"name": name, "namespace": LEASE_NAMESPACE, "ownerReferences": [owner]}, "spec": spec}
            await self._leases.create_namespaced_lease(LEASE_NAMESPACE, lease)

    async def delete(self) -> None:
        try:
            await self._core.delete_node(self.config.name)
        except ApiException as error:
            if error.status != 404:
                raise
