"""The loopback kubelet process: one NodeAgent per fake Node, the gpu-map publisher and the control endpoint;
on simulated Nodes also the simulation processes (`simulation.py`)."""

import asyncio
import copy
import logging
import signal

from aiohttp import web
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from e2e.kubelet import oci
from e2e.kubelet.addresses import AddressBlock, SubnetCarver
from e2e.kubelet.agent import NodeAgent
from e2e.kubelet.apierrors import UNREACHABLE
from e2e.kubelet.config import GpuMode, KubeletConfig, NodeConfig
from e2e.kubelet.control import ConflictError, NodeInfo, NotFoundError, announce_url, control_app
from e2e.kubelet.gpumap import publish_gpu_map
from e2e.kubelet.images import ImageMap
from e2e.kubelet.simulation import Simulations
from kube.client import ApiLimits, LimitedApiClient

log = logging.getLogger(__name__)

# The requests about Pods (status, Events, tokens) of every Node share this many connections: when the API
# server is slow they queue in the client, as a real kubelet's requests share the streams of its one HTTP/2
# connection. What each Node holds or must not queue, its watches (of its Pods, of the ConfigMaps and Secrets
# they use: a connection each for minutes) and its heartbeats (Lease and Node status: at most one at a time per
# Node), goes through a pool without a limit, which never caps how many Nodes one process plays. With one
# unlimited pool for everything, 1,250 Nodes on a saturated API server held 6,169 connections, and with the
# probes' 10,000 the process ran out of descriptors (its open-files limit is 20,000); with heartbeats behind
# the capped Pod requests, Leases came late and the node lifecycle controller evicted Pods.
REQUEST_CONNECTIONS = 256


class Kubelet:
    def __init__(self, settings: KubeletConfig) -> None:
        self.settings = settings
        self.images = ImageMap(settings.image_maps)  # fails early on a bad image map
        self._agents: dict[str, NodeAgent] = {}
        self._blocks: dict[str, AddressBlock] = {}  # kept across lose/add, so a Node keeps its addresses
        self._gpu_map_namespaces: list[str] = []
        self._starting: set[str] = set()  # Nodes registering now
        self._lock = asyncio.Lock()  # one Node lost at a time
        self._api: client.ApiClient | None = None
        self._node_api: client.ApiClient | None = None
        self._version = ""  # the API server's: this kubelet is of the control plane's release
        # Pods whose image is in local container storage run from it (oci.py), where podman is installed.
        self.oci_owner = oci.owner_id(settings.state_dir) if oci.podman_available() else None
        simulation = settings.simulation
        self.simulations = Simulations(settings, simulation) if simulation is not None else None
        # Many simulated Nodes share blocks (a /24 each); others claim a whole block each.
        self._carver = SubnetCarver(settings.address_lock_dir) if simulation is not None else None

    @property
    def api(self) -> client.ApiClient:
        assert self._api is not None, "the kubelet is not running"
        return self._api

    @property
    def node_api(self) -> client.ApiClient:
        assert self._node_api is not None, "the kubelet is not running"
        return self._node_api

    def nodes(self) -> list[NodeInfo]:
        return [
            NodeInfo(name=name, host_ip=agent.runtime.host_ip, gpus=agent.gpus.index_map())
            for name, agent in sorted(self._agents.items())
        ]

    async def add_node(self, name: str, gpus: int, gpu_mode: GpuMode = "device-plugin") -> NodeInfo:
        return await self._add(NodeConfig(name=name, gpus=gpus, gpu_mode=gpu_mode))

    async def _add(self, node: NodeConfig) -> NodeInfo:
        # Nodes register concurrently (hundreds of simulated ones at start-up); one name only once.
        if node.name in self._agents or node.name in self._starting:
            raise ConflictError(f"node {node.name} already exists")
        self._starting.add(node.name)
        try:
            if node.name not in self._blocks:
                self._blocks[node.name] = (
                    self._carver.carve() if self._carver else AddressBlock.claim(self.settings.address_lock_dir)
                )
            agent = NodeAgent(
                self.api,
                self.node_api,
                self.settings,
                node,
                self.images,
                self._blocks[node.name],
                self.oci_owner,
                self._version,
                self.simulations,
            )
            await agent.start()
            self._agents[node.name] = agent
        finally:
            self._starting.discard(node.name)
        await self._refresh_gpu_maps()
        return next(n for n in self.nodes() if n.name == node.name)

    async def lose_node(self, name: str) -> None:
        async with self._lock:
            agent = self._agents.pop(name, None)
            if agent is None:
                raise NotFoundError(f"no node {name}")
            await agent.lose()
        await self._refresh_gpu_maps()

    async def publish_gpu_map(self, namespace: str) -> None:
        if namespace not in self._gpu_map_namespaces:
            self._gpu_map_namespaces.append(namespace)
        await self._publish(namespace)

    async def _publish(self, namespace: str) -> None:
        mapping = {n.name: n.gpus for n in self.nodes()}
        try:
            await publish_gpu_map(client.CoreV1Api(self.api), namespace, mapping)
        except UNREACHABLE as error:
            log.warning("gpu-map not published in %s: %r", namespace, error)
            return
        except ApiException as error:
            if error.status not in (403, 404):
                log.warning("gpu-map not published in %s: %s", namespace, error.reason)
                return
            # A deleted (or terminating) namespace: stop maintaining the map there.
            log.info("gpu-map no longer kept in %s: %s", namespace, error.reason)
            self._gpu_map_namespaces.remove(namespace)

    async def _refresh_gpu_maps(self) -> None:
        for namespace in list(self._gpu_map_namespaces):
            await self._publish(namespace)

    @staticmethod
    def _client(loaded: client.Configuration, connections: int) -> client.ApiClient:
        """The controllers' client (no proxy looked up per request) with a pool of `connections` (0: no limit),
        without their rate limit: a kubelet's is its own Node's heartbeats and Pods."""
        configuration = copy.deepcopy(loaded)
        configuration.connection_pool_maxsize = connections
        return LimitedApiClient(configuration, ApiLimits(qps=0), metrics=None)

    async def run(self) -> None:
        """Register the Nodes, serve the control endpoint, and run until SIGTERM or SIGINT."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        loaded = client.Configuration()
        await config.load_kube_config(config_file=str(self.settings.kubeconfig), client_configuration=loaded)
        self._api = self._client(loaded, REQUEST_CONNECTIONS)
        self._node_api = self._client(loaded, 0)
        self._version = (await client.VersionApi(self._api).get_code()).git_version
        runner = web.AppRunner(control_app(self))
        watchdog = None
        if self.oci_owner is not None:
            oci.remove_owned(self.oci_owner)  # left by an earlier kubelet on this state directory
            watchdog = oci.start_watchdog(self.oci_owner)
            log.info("%s %s", oci.ENABLED_MESSAGE, self.oci_owner)
        else:
            log.info("podman is not installed: every container runs as a local process")
        try:
            if self.simulations is not None:
                await self.simulations.start()
            await asyncio.gather(*(self._add(node) for node in self.settings.nodes))
            for namespace in self.settings.gpu_map_namespaces:
                await self.publish_gpu_map(namespace)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            announce_url(self.settings.control_file, port)
            log.info("loopback kubelet up: nodes %s, control endpoint on port %d", sorted(self._agents), port)
            await stop.wait()
        finally:
            log.info("stopping: containers get %.1f s", self.settings.shutdown_grace_seconds)
            await asyncio.gather(*(a.shutdown(self.settings.shutdown_grace_seconds) for a in self._agents.values()))
            await runner.cleanup()
            await self.api.close()
            await self.node_api.close()
            if self.simulations is not None:
                await self.simulations.close()
            for block in self._blocks.values():
                block.release_block()
            if self._carver is not None:
                self._carver.release_blocks()
            if watchdog is not None:
                watchdog.communicate()  # closing its stdin: it removes any container still left, and exits
