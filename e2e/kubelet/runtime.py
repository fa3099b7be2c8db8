"""What a Pod worker needs from its Node and from the kubelet process, in one place."""

from dataclasses import dataclass

from kubernetes_asyncio import client

from e2e.kubelet.addresses import AddressBlock
from e2e.kubelet.config import GpuMode, KubeletConfig
from e2e.kubelet.events import EventRecorder
from e2e.kubelet.gpus import GpuAllocator
from e2e.kubelet.images import ImageMap
from e2e.kubelet.objects import ObjectWatches
from e2e.kubelet.simulation import Simulations
from kube.client import answer_of


@dataclass(frozen=True)
class NodeRuntime:
    node: str
    addresses: AddressBlock
    gpus: GpuAllocator
    core: client.CoreV1Api
    watches: client.CoreV1Api  # for lists and watches: a pool without a limit (see kubelet.REQUEST_CONNECTIONS)
    events: EventRecorder
    images: ImageMap
    objects: ObjectWatches  # the ConfigMaps and Secrets its Pods use
    config: KubeletConfig
    # The label of this kubelet's OCI containers (`oci.py`); None where podman is not installed, so every
    # container runs as a local process.
    oci_owner: str | None = None
    # Simulated Nodes: the simulation processes that run the containers of their images.
    simulations: Simulations | None = None
    gpu_mode: GpuMode = "device-plugin"

    @property
    def gpus_through_cdi(self) -> bool:
        """GPUs reach containers as CDI edits (`void`), not as a UUID list (`cdi.py`)."""
        return self.gpu_mode != "device-plugin"

    @property
    def host_ip(self) -> str:
        return str(self.addresses.host_ip)

    def service_env(self) -> dict[str, str]:
        """The variables a kubelet gives every container for the `kubernetes` Service, pointing at the
        API server's loopback address instead of the ClusterIP (nothing may dial a ClusterIP here)."""
        host, port = self.config.api_server_host, str(self.config.api_server_port)
        url = f"tcp://{host}:{port}"
        return {
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": port,
            "KUBERNETES_SERVICE_PORT_HTTPS": port,
            "KUBERNETES_PORT": url,
            "KUBERNETES_PORT_443_TCP": url,
            "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
            "KUBERNETES_PORT_443_TCP_ADDR": host,
            "KUBERNETES_PORT_443_TCP_PORT": port,
        }

    async def service_account_token(self, pod: client.V1Pod, audience: str | None, expiration_seconds: int) -> str:
        """A token of the Pod's ServiceAccount bound to the Pod (the TokenRequest API, as a kubelet asks)."""
        bound = {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "uid": pod.metadata.uid}
        request = {
            "spec": {
                "audiences": [audience] if audience else [],
                "expirationSeconds": expiration_seconds,
                "boundObjectRef": bound,
            }
        }
        account = pod.spec.service_account_name or "default"
        granted = await answer_of(
            self.core.create_namespaced_service_account_token(
                account, pod.metadata.namespace, request, _preload_content=False
            )
        )
        return str(granted["status"]["token"])
