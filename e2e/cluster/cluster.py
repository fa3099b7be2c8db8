"""A whole loopback cluster in one state directory: the control plane plus the loopback kubelet process.

`up` and `down` are idempotent; `down` stops exactly the processes `up` recorded (by PID and start
time) and removes the directory. The same class serves `make cluster-up` and the pytest fixture.
"""

import asyncio
import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config
from pydantic import BaseModel

from e2e.cluster import processes
from e2e.cluster.binaries import Binaries
from e2e.cluster.control_plane import LOOPBACK, MANY_NODES, ControlPlane, Ports, Tuning
from e2e.cluster.readiness import StartupError, log_tail, wait_http_ok
from e2e.kubelet.config import GpuMode, KubeletConfig, NodeConfig, SimulationConfig
from e2e.kubelet.control_client import KubeletControl
from e2e.kubelet.logs import read_container_log
from e2e.kubelet.simulation import SimulationClient, url_files
from e2e.simulation.protocol import Role

# Every process gets this long to exit on SIGTERM before SIGKILL (the kubelet stops its containers first).
_STOP_GRACE_SECONDS = 10.0
_KUBELET = "kubelet"
APISERVER = "kube-apiserver"


class ClusterState(BaseModel):
    """Written once the cluster is up (`cluster.json`); what clients need to reach it."""

    apiserver_url: str
    apiserver_port: int
    kubeconfig: str
    kubelet_control_url: str
    nodes: list[str]
    simulated: bool = False  # KWOK-like Nodes: requesters and launchers served by simulation processes


class LoopbackCluster:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir.resolve()
        self.state_file = self.state_dir / "cluster.json"
        self.kubeconfig = self.state_dir / "kubeconfig"
        self.records_dir = self.state_dir / "processes"
        self.kubelet_dir = self.state_dir / "kubelet"

    def is_up(self) -> bool:
        recorded = processes.records(self.records_dir)
        return self.state_file.is_file() and bool(recorded) and all(processes.is_running(r) for r in recorded)

    def state(self) -> ClusterState:
        return ClusterState.model_validate_json(self.state_file.read_text())

    @property
    def kubelet(self) -> KubeletControl:
        return KubeletControl(self.state().kubelet_control_url)

    def pids(self) -> dict[str, int]:
        return {r.name: r.pid for r in processes.records(self.records_dir)}

    async def up(
        self,
        nodes: list[NodeConfig],
        *,
        apiserver_port: int = 0,
        etcd_port: int = 0,
        die_with_parent: bool = False,
        simulated: bool = False,
    ) -> dict[str, float]:
        """Start everything and wait until the Nodes are Ready; returns seconds per step. `simulated`: the
        Nodes are simulated (`e2e/simulation`), with the heartbeats and control-plane limits of a large cluster.

        Already up: nothing happens. Half up (a crash, a reboot): cleaned and started afresh.
        """
        if self.is_up():
            return {}
        self.down()
        start = time.monotonic()
        self.state_dir.mkdir(parents=True)
        try:
            plane = ControlPlane(
                self.state_dir,
                Ports.choose(apiserver_port, etcd_port),
                Binaries.locate(),
                die_with_parent=die_with_parent,
                tuning=MANY_NODES if simulated else Tuning(),
            )
            timings = await plane.start()
            settings = KubeletConfig(
                kubeconfig=plane.kubelet_kubeconfig,
                state_dir=self.kubelet_dir,
                api_server_host=LOOPBACK,
                api_server_port=plane.ports.apiserver,
                nodes=nodes,
            )
            if simulated:
                # A real kubelet's rhythm: the Lease every 10 s, the Node's status every 5 min.
                settings.simulation = SimulationConfig.for_nodes(len(nodes))
                settings.lease_renew_seconds, settings.node_status_seconds = 10.0, 300.0
            settings_file = self.kubelet_dir / "config.yaml"
            settings.save(settings_file)
            kubelet = processes.spawn(
                _KUBELET,
                [sys.executable, "-m", "e2e.kubelet", "--config", str(settings_file)],
                log=plane.logs_dir / "kubelet.log",
                record_dir=self.records_dir,
                die_with_parent=die_with_parent,
            )
            control_url = await self._wait_kubelet(kubelet, settings, plane.logs_dir / "kubelet.log")
            timings["kubelet"] = await self._wait_nodes_ready([n.name for n in nodes])
            state = ClusterState(
                apiserver_url=plane.url,
                apiserver_port=plane.ports.apiserver,
                kubeconfig=str(self.kubeconfig),
                kubelet_control_url=control_url,
                nodes=[n.name for n in nodes],
                simulated=simulated,
            )
            self.state_file.write_text(state.model_dump_json(indent=2))
        except BaseException:
            self.down()
            raise
        timings["total"] = time.monotonic() - start
        return timings

    @staticmethod
    async def _wait_kubelet(process: "subprocess.Popen[bytes]", settings: KubeletConfig, log: Path) -> str:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise StartupError(f"the kubelet exited with {process.returncode}; log {log}:\n{log_tail(log)}")
            if settings.control_file.is_file():
                return settings.control_file.read_text().strip()
            await asyncio.sleep(0.2)
        raise StartupError(f"the kubelet did not come up in 60 s; log {log}:\n{log_tail(log)}")

    async def _wait_nodes_ready(self, names: list[str], limit: float = 60.0) -> float:
        """Ready and untainted (the node lifecycle controller lifts the not-ready taint admission adds)."""
        start = time.monotonic()
        async with await self.api_client() as api:
            core = client.CoreV1Api(api)
            while time.monotonic() - start < limit:
                nodes = {n.metadata.name: n for n in (await core.list_node()).items}
                if all(name in nodes and node_is_ready(nodes[name]) for name in names):
                    return time.monotonic() - start
                await asyncio.sleep(0.2)
        raise StartupError(f"nodes {names} not Ready and untainted after {limit:.0f} s")

    def down(self) -> None:
        """Stop every recorded process and remove the state directory; nothing to do when already down."""
        recorded = processes.records(self.records_dir)
        # The kubelet first, so that it stops its containers while the API server still answers.
        processes.stop([r for r in recorded if r.name == _KUBELET], _STOP_GRACE_SECONDS)
        processes.stop([r for r in recorded if r.name != _KUBELET], _STOP_GRACE_SECONDS)
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def simulations(self, role: Role, session: aiohttp.ClientSession) -> list[SimulationClient]:
        """The control APIs of the kubelet's simulation processes of `role` (simulated clusters only)."""
        return [SimulationClient(f.read_text().strip(), session) for f in url_files(self.kubelet_dir, role)]

    def stop_apiserver(self) -> None:
        """An API-server outage begins: the kube-apiserver process stops (its connections are refused)."""
        processes.stop([processes.by_name(self.records_dir, APISERVER)], _STOP_GRACE_SECONDS)

    async def start_apiserver(self) -> float:
        """The outage ends: the kube-apiserver starts again as it was; returns seconds until it is ready."""
        process = processes.start_again(self.records_dir, APISERVER)
        tls = ssl.create_default_context(cafile=str(self.state_dir / "pki" / "ca.crt"))
        tls.load_cert_chain(self.state_dir / "pki" / "admin.crt", self.state_dir / "pki" / "admin.key")
        log = Path(processes.by_name(self.records_dir, APISERVER).log)
        return await wait_http_ok(
            APISERVER, f"{self.state().apiserver_url}/readyz", process, log, ssl_context=tls, limit=90
        )

    async def api_client(self) -> client.ApiClient:
        """A new admin client; close it (or use `async with`)."""
        return await config.new_client_from_config(config_file=str(self.kubeconfig))

    def container_log(self, pod: client.V1Pod, container: str, *, previous: bool = False) -> str:
        meta = pod.metadata
        logs = KubeletConfig.load(self.kubelet_dir / "config.yaml").logs_dir
        return read_container_log(logs, meta.namespace, meta.name, meta.uid, container, previous=previous)


def _ready(conditions: list[Any] | None) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in conditions or [])


def node_is_ready(node: client.V1Node) -> bool:
    return _ready(node.status.conditions) and not node.spec.taints


def pod_is_ready(pod: client.V1Pod) -> bool:
    return _ready(pod.status.conditions)


def default_nodes(count: int = 2, gpus: int = 2, gpu_mode: GpuMode = "device-plugin") -> list[NodeConfig]:
    return [NodeConfig(name=f"gpu-node-{i + 1}", gpus=gpus, gpu_mode=gpu_mode) for i in range(count)]
