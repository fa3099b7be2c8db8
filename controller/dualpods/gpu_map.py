"""FMA's `gpu-map` ConfigMap: where each GPU is. Direct providers see every GPU of their node and are confined to
their requester's by `CUDA_VISIBLE_DEVICES`, which takes indices, while requesters report UUIDs; this map translates.

Each data key is a Node's name and its value JSON `{"<UUID>": index}`. An entry that does not parse is left out
(its GPUs are then "not known"), so one bad node does not stop the others.
"""

import json
import logging
from dataclasses import dataclass
from typing import Any

from api.keys import GPU_MAP_CONFIGMAP

log = logging.getLogger(__name__)


class GpuMapError(Exception):
    """The map cannot place the requester's GPUs; `errors` are FMA's status messages, one per problem."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


@dataclass(frozen=True)
class GpuLocation:
    node: str
    index: int


def gpu_locations(configmap: dict[str, Any]) -> dict[str, GpuLocation]:
    """UUID -> where it is, from the ConfigMap's data."""
    found: dict[str, GpuLocation] = {}
    for node, text in (configmap.get("data") or {}).items():
        try:
            mapping = json.loads(text)
            entries = {str(uuid): GpuLocation(node, int(index)) for uuid, index in mapping.items()}
        except (ValueError, TypeError, AttributeError) as err:
            log.warning("%s: ignoring the entry of node %s: %s", GPU_MAP_CONFIGMAP, node, err)
            continue
        found.update(entries)
    return found


def gpu_indices(configmap: dict[str, Any] | None, node: str, uuids: list[str]) -> list[str]:
    """The CUDA indices of `uuids`, which must all be on `node`, in the same order."""
    if configmap is None:
        raise GpuMapError([f"GPU map ConfigMap {GPU_MAP_CONFIGMAP} is not available"])
    locations = gpu_locations(configmap)
    errors = []
    indices = []
    for uuid in uuids:
        location = locations.get(uuid)
        if location is None:
            errors.append(f"UUID {uuid} is not known")
        elif location.node != node:
            errors.append(f"UUID {uuid} is on Node {location.node}, not {node}")
        else:
            indices.append(str(location.index))
    if errors:
        raise GpuMapError(errors)
    return indices
