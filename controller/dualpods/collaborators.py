"""What the dual-pods reconciler needs from outside its process, as Protocols: the API server's Pods,
Events, ISC statuses and ResourceSlices, the launchers, the requesters and the model servers. The real
implementations are PodWriter, LauncherClient, RequesterClient, ProviderClient, EventRecorder, StatusWriter
and SliceDevices; unit tests give in-memory fakes.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from api.launcher import AllInstancesState, InstanceState, VllmConfig
from controller import pods
from controller.dualpods.devices import Device
from controller.dualpods.placement.claim_templates import ClaimTemplates
from controller.status_writer import StatusWrites
from kube.events import EventSink


class PodWrites(Protocol):
    """Optimistic writes of Pods (controller.dualpods.writer.PodWriter)."""

    async def update(
        self, pod: pods.Pod, mutate: Callable[[pods.Pod], None], why: str, *, if_unchanged: bool = True
    ) -> str | None:
        """Write `mutate`(a copy of `pod`) if it changed anything, only if the Pod is as cached (or, with
        `if_unchanged=False`, the same incarnation); the written resourceVersion, None if nothing changed."""
        ...

    async def create(self, pod: pods.Pod) -> pods.Pod: ...

    async def delete(self, pod: pods.Pod, why: str) -> None:
        """Delete exactly this incarnation; gone counts as done."""
        ...


class Launchers(Protocol):
    """The launcher REST API (controller.launcher_client.LauncherClient)."""

    async def list_instances(self, pod_ip: str, isc_name: str = "") -> AllInstancesState: ...

    async def create_instance(
        self, pod_ip: str, instance_id: str, config: VllmConfig, isc_name: str, requester: str
    ) -> InstanceState: ...

    async def delete_instance(self, pod_ip: str, instance_id: str, isc_name: str = "", requester: str = "") -> None: ...

    async def sleep(self, pod_ip: str, instance_id: str, isc_name: str, requester: str) -> None: ...

    async def wake(self, pod_ip: str, instance_id: str, isc_name: str, requester: str) -> None: ...


class Requesters(Protocol):
    """The requester's SPI (controller.dualpods.requester_client.RequesterClient)."""

    async def gpu_uuids(self, requester: pods.Pod, isc_name: str) -> list[str]: ...

    async def memory_usage(self, requester: pods.Pod, isc_name: str) -> dict[str, int]: ...

    async def configure_proxy(self, requester: pods.Pod, address: str, port: int, isc_name: str) -> None: ...

    async def relay_readiness(self, requester: pods.Pod, ready: bool, isc_name: str) -> None: ...


class Devices(Protocol):
    """The DRA devices of a Node's GPUs (`devices.py`)."""

    async def named(self, node: str, uuids: list[str]) -> dict[str, Device]:
        """UUID -> `<driver>/<pool>/<device>`, for those of `uuids` a DRA driver publishes on `node`."""
        ...


class ModelServers(Protocol):
    """A model server's own routes (controller.dualpods.provider_client.ProviderClient)."""

    async def is_sleeping(self, pod_ip: str, port: int, requester: str) -> bool: ...

    async def sleep(self, pod_ip: str, port: int, requester: str) -> None: ...

    async def wake(self, pod_ip: str, port: int, requester: str) -> None: ...

    async def lora_adapters(self, pod_ip: str, port: int, requester: str) -> set[str]: ...

    async def load_lora(self, pod_ip: str, port: int, name: str, path: str, requester: str) -> None: ...

    async def unload_lora(self, pod_ip: str, port: int, name: str, requester: str) -> None: ...


@dataclass(frozen=True)
class Clients:
    """Everything the reconciler calls outside the process."""

    pods: PodWrites
    launchers: Launchers
    requesters: Requesters
    servers: ModelServers
    events: EventSink
    statuses: StatusWrites
    devices: Devices
    claim_templates: ClaimTemplates | None = None  # placement's derived templates on DRA Nodes (placement/)
