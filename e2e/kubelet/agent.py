"""The kubelet of one Node: its registration and heartbeat, its address block, GPUs and pod sync loop."""

import logging

from kubernetes_asyncio import client

from api.tasks import Background
from e2e.kubelet import dra
from e2e.kubelet.addresses import AddressBlock
from e2e.kubelet.config import KubeletConfig, NodeConfig
from e2e.kubelet.events import EventRecorder
from e2e.kubelet.gpus import GpuAllocator
from e2e.kubelet.images import ImageMap
from e2e.kubelet.node import NodeRegistration
from e2e.kubelet.objects import ObjectWatches
from e2e.kubelet.runtime import NodeRuntime
from e2e.kubelet.simulation import Simulations
from e2e.kubelet.sync import PodSync

log = logging.getLogger(__name__)


class NodeAgent:
    def __init__(
        self,
        api: client.ApiClient,
        node_api: client.ApiClient,
        config: KubeletConfig,
        node: NodeConfig,
        images: ImageMap,
        addresses: AddressBlock,
        oci_owner: str | None,
        kubelet_version: str,
        simulations: Simulations | None = None,
    ) -> None:
        """`api` sends the requests about Pods (a capped pool); `node_api` the Node's watches and heartbeats
        (a pool without a limit: see kubelet.REQUEST_CONNECTIONS)."""
        core, watches = client.CoreV1Api(api), client.CoreV1Api(node_api)
        self.config = node
        self.gpus = GpuAllocator(node.name, node.gpus)
        self.runtime = NodeRuntime(
            node=node.name,
            addresses=addresses,
            gpus=self.gpus,
            core=core,
            watches=watches,
            events=EventRecorder(core, node.name),
            images=images,
            objects=ObjectWatches(watches),
            config=config,
            oci_owner=oci_owner,
            simulations=simulations,
            gpu_mode=node.gpu_mode,
        )
        self.registration = NodeRegistration(
            node_api,
            node,
            self.runtime.host_ip,
            kubelet_version,
            config.lease_renew_seconds,
            config.node_status_seconds,
        )
        self._sync = PodSync(self.runtime)
        self._running = Background()  # the heartbeat and the pod sync, until the Node is lost or shut down

    async def start(self) -> None:
        await self.registration.register()
        if self.config.gpu_mode == "dra":
            await dra.publish(self.runtime.core.api_client, self.config.name, self.gpus.uuids)
        self._running.start(self.registration.heartbeat(), name=f"heartbeat {self.config.name}")
        self._running.start(self._sync.run(), name=f"pod sync {self.config.name}")

    async def lose(self) -> None:
        """Node failure: its processes die at once, heartbeats stop and the Node object is deleted.
        Its Pods stay in the API until the controller-manager's pod GC removes them (about 40-60 s)."""
        await self._running.stop()
        await self._sync.abandon()
        await self.runtime.objects.close()
        await self.registration.delete()
        log.info("lost node %s", self.config.name)

    async def shutdown(self, grace_seconds: float) -> None:
        """The kubelet stops: containers get `grace_seconds`, the Node object stays (it goes NotReady)."""
        await self._running.stop()
        await self._sync.stop_all(grace_seconds)
        await self.runtime.objects.close()
