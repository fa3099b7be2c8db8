"""`NVIDIA_VISIBLE_DEVICES`: which GPUs the device plugin gave this container.

NVML in a container may see every GPU of the node (privileged containers, some runtimes), so the
requester reads the variable as nvidia-container-runtime does: `all` means every GPU, `none` and the
empty string mean none, otherwise a comma-separated list of GPU UUIDs and/or NVML indices. Unset
means "no restriction": outside a container, or in a CUDA base image (whose default is `all`), NVML
then sees exactly the GPUs the process may use.

`void` is what every CDI spec NVIDIA generates sets (the GPU Operator's device plugin from v25.10,
NVIDIA's DRA driver): the GPUs were injected as device nodes, so NVML sees exactly the container's
GPUs and the variable names none of them. Under the legacy runtime `void` injects no device node, so
NVML then sees none: either way every GPU NVML sees is ours.
"""

import re
from dataclasses import dataclass
from enum import Enum

from api.keys import SIMULATED_NVML_ENV

__all__ = ["ENV_NAME", "SIMULATED_NVML_ENV", "Scope", "VisibleDevices", "parse"]

ENV_NAME = "NVIDIA_VISIBLE_DEVICES"
_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]+$")
_INDEX = re.compile(r"^[0-9]+$")


class Scope(Enum):
    ALL = "all"
    NONE = "none"
    LISTED = "listed"
    INJECTED = "injected"  # `void`: the GPUs came as CDI device nodes, NVML sees only those


@dataclass(frozen=True)
class VisibleDevices:
    """The parsed variable; `ignored` holds list entries that are neither UUIDs nor indices."""

    scope: Scope
    uuids: tuple[str, ...] = ()
    indices: tuple[int, ...] = ()
    ignored: tuple[str, ...] = ()


def parse(value: str | None) -> VisibleDevices:
    """Parse the variable's value (None when unset).

    A value that names no UUID or index at all, such as the device plugin's volume-mounts marker
    `/var/run/nvidia-container-devices`, restricts nothing: the runtime then exposes only the
    container's GPUs to NVML, so every GPU NVML sees is ours.
    """
    if value is None:
        return VisibleDevices(Scope.ALL)
    text = value.strip()
    if text.lower() == "all":
        return VisibleDevices(Scope.ALL)
    if text.lower() == "void":
        return VisibleDevices(Scope.INJECTED)
    if text.lower() in ("", "none"):
        return VisibleDevices(Scope.NONE)
    entries = [entry.strip() for entry in text.split(",") if entry.strip()]
    uuids = tuple(e for e in entries if _UUID.match(e))
    indices = tuple(int(e) for e in entries if _INDEX.match(e))
    ignored = tuple(e for e in entries if not _UUID.match(e) and not _INDEX.match(e))
    if not uuids and not indices:
        return VisibleDevices(Scope.ALL, ignored=ignored)
    return VisibleDevices(Scope.LISTED, uuids, indices, ignored)
