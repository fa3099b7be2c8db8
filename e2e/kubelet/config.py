"""The loopback kubelet's configuration file (YAML, camelCase keys), written by `e2e.cluster` or by hand."""

import math
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from e2e.kubelet.addresses import DEFAULT_LOCK_DIR
from e2e.kubelet.images import DEFAULT_IMAGE_MAP


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)


# How a Node's GPUs reach Pods: NVIDIA's device plugin (`nvidia.com/gpu` allocatable, NVIDIA_VISIBLE_DEVICES
# holding UUIDs), the same through CDI (GPU Operator >= v25.10: `void` plus CDI edits), or NVIDIA's DRA driver
# (no `nvidia.com/gpu`; a ResourceSlice, claims allocated by the scheduler, CDI edits). See `dra.py`, `cdi.py`.
GpuMode = Literal["device-plugin", "device-plugin-cdi", "dra"]


class NodeConfig(_Model):
    """One fake GPU Node."""

    name: str
    gpus: int = Field(default=2, ge=0)
    gpu_mode: GpuMode = "device-plugin"
    cpu: str = "32"
    memory: str = "128Gi"
    pods: int = 110


SimulatedRole = Literal["requester", "launcher"]
# FMA's requester image too, so FMA's manifests run unchanged on simulated Nodes.
SIMULATED_IMAGES: dict[str, SimulatedRole] = {
    "dualpods/requester": "requester",
    "ghcr.io/llm-d-incubation/llm-d-fast-model-actuation/requester": "requester",
    "dualpods/launcher": "launcher",
}


# A simulation process holds a few sockets per container it serves (the Pod's listeners, the kept probe
# connections, the controllers' calls): 6.3 per launcher at its peak with 1,000 launchers. No process may hold
# more than its open-files limit (20,000, hard, on the polyglot machines), so a large cluster spreads each
# role's containers over one process per this many Nodes (at 4 GPUs a Node, about 10,000 descriptors each).
NODES_PER_SIMULATION_PROCESS = 400


class SimulationConfig(_Model):
    """Simulated Nodes (KWOK-like, `e2e/simulation`): containers of these images (repositories, any tag)
    are served by simulation processes of their role instead of a process each; every other container runs
    as on other Nodes."""

    images: dict[str, SimulatedRole] = Field(default_factory=lambda: dict(SIMULATED_IMAGES))
    log_level: str = "WARNING"  # of the simulation processes (their own logs, not the containers')
    processes_per_role: int = Field(default=1, ge=1)  # a Pod's containers go to one of them, chosen by its UID

    @classmethod
    def for_nodes(cls, count: int) -> "SimulationConfig":
        """Enough processes per role for `count` Nodes' containers to stay within each one's open-files limit."""
        return cls(processes_per_role=max(1, math.ceil(count / NODES_PER_SIMULATION_PROCESS)))


class KubeletConfig(_Model):
    kubeconfig: Path
    state_dir: Path
    # Where processes in Pods reach the API server (KUBERNETES_SERVICE_HOST/PORT): never a ClusterIP.
    api_server_host: str = "127.0.0.1"
    api_server_port: int
    nodes: list[NodeConfig] = Field(
        default_factory=lambda: [NodeConfig(name="gpu-node-1"), NodeConfig(name="gpu-node-2")]
    )
    gpu_map_namespaces: list[str] = Field(default_factory=lambda: ["default"])
    image_maps: list[Path] = Field(default_factory=lambda: [DEFAULT_IMAGE_MAP])
    # Crash-loop back-off: first restart at once, then initial, doubling up to max (real kubelet: 10 s, 300 s).
    restart_backoff_initial_seconds: float = 0.5
    restart_backoff_max_seconds: float = 10.0
    # Grace given to containers when the kubelet itself stops (cluster down).
    shutdown_grace_seconds: float = 2.0
    lease_renew_seconds: float = 5.0
    # How often the Node's Ready conditions are posted again (a real kubelet: every 5 min with a Lease).
    node_status_seconds: float = 30.0
    address_lock_dir: Path = DEFAULT_LOCK_DIR
    simulation: SimulationConfig | None = None

    @classmethod
    def load(cls, path: Path) -> "KubeletConfig":
        return cls.model_validate(yaml.safe_load(path.read_text()))

    def save(self, path: Path) -> None:
        path.write_text(yaml.safe_dump(self.model_dump(mode="json", by_alias=True), sort_keys=False))

    @property
    def pods_dir(self) -> Path:
        return self.state_dir / "pods"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def control_file(self) -> Path:
        """Holds the control endpoint's URL once the kubelet is up (see `control.py`)."""
        return self.state_dir / "control-url"
