"""The loopback kubelet's configuration file (YAML, camelCase keys), written by `e2e.cluster` or by hand."""

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from e2e.kubelet.addresses import DEFAULT_LOCK_DIR
from e2e.kubelet.images import DEFAULT_IMAGE_MAP


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)


class NodeConfig(_Model):
    """One fake GPU Node."""

    name: str
    gpus: int = Field(default=2, ge=0)
    cpu: str = "32"
    memory: str = "128Gi"
    pods: int = 110


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
    address_lock_dir: Path = DEFAULT_LOCK_DIR

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
