"""Fake GPUs (none exist here): UUID-shaped names per Node and exclusive assignment, as the device plugin does."""

import uuid

RESOURCE = "nvidia.com/gpu"
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
_UUID_NAMESPACE = uuid.UUID("6f1d1c9e-3a53-4d4e-9a43-6c6f6f706261")


def gpu_uuid(node: str, index: int) -> str:
    """Deterministic from node name and index, in NVIDIA's `GPU-<uuid>` form."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node}/{index}')}"


class InsufficientGpusError(RuntimeError):
    """Fewer free GPUs than requested; the kubelet fails the Pod's admission."""


class GpuAllocator:
    """The GPUs of one Node; each is held by at most one owner (a Pod UID) at a time."""

    def __init__(self, node: str, count: int) -> None:
        self.uuids = [gpu_uuid(node, i) for i in range(count)]
        self._owner: dict[str, str] = {}

    def index_map(self) -> dict[str, int]:
        return {u: i for i, u in enumerate(self.uuids)}

    def allocate(self, owner: str, count: int) -> list[str]:
        """`count` free GPUs for `owner` (the same ones again if it already holds them)."""
        held = [u for u in self.uuids if self._owner.get(u) == owner]
        if len(held) >= count:
            return held[:count]
        free = [u for u in self.uuids if u not in self._owner]
        if len(free) < count:
            raise InsufficientGpusError(
                f"Allocate failed due to requested number of devices unavailable for {RESOURCE}. "
                f"Requested: {count}, Available: {len(free)}"
            )
        for u in free[:count]:
            self._owner[u] = owner
        return free[:count]

    def release(self, owner: str) -> None:
        self._owner = {u: o for u, o in self._owner.items() if o != owner}
