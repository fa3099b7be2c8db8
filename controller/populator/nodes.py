"""The facts about a Node that population policies select on: its labels, `status.allocatable`, and the devices
DRA drivers publish for it in ResourceSlices.

A Node's status changes with every heartbeat; only a change of these facts can change which
policies select it, or whether launchers may be made there, so only such a change is worth digesting again.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from api.selectors import EnhancedNodeSelector
from controller import pods


def dra_device_counts(slices: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Driver -> the devices it publishes in these slices (one Node's), counting each pool at its newest
    generation only, as the scheduler does: the slices of an older generation are being replaced."""
    pools = []
    for each in slices:
        spec = each.get("spec") or {}
        pool = spec.get("pool") or {}
        pools.append(((str(spec.get("driver", "")), str(pool.get("name", ""))), int(pool.get("generation", 0)), spec))
    newest: dict[tuple[str, str], int] = {}
    for pool_id, generation, _ in pools:
        newest[pool_id] = max(newest.get(pool_id, generation), generation)
    counts: dict[str, int] = {}
    for (driver, pool_name), generation, spec in pools:
        if generation == newest[(driver, pool_name)] and spec.get("devices"):
            counts[driver] = counts.get(driver, 0) + len(spec["devices"])
    return counts


@dataclass(frozen=True)
class NodeFacts:
    name: str
    labels: Mapping[str, str]
    allocatable: Mapping[str, str]
    dra_devices: Mapping[str, int] = field(default_factory=dict)
    """DRA driver -> the devices it publishes for the Node (`dra_device_counts`)."""
    cordoned: bool = False
    """Cordoned or being deleted: a drain's business, so the populator makes and removes no launcher there, and
    policies do not count it (a launcher made there would wait Unschedulable until the Node came back)."""

    @classmethod
    def from_k8s(cls, node: dict[str, Any], slices: Iterable[Mapping[str, Any]] = ()) -> "NodeFacts":
        """The facts of `node`, with `slices`: the ResourceSlices whose `spec.nodeName` is the Node."""
        return cls(
            name=node["metadata"]["name"],
            labels=dict(node["metadata"].get("labels") or {}),
            allocatable=dict((node.get("status") or {}).get("allocatable") or {}),
            dra_devices=dra_device_counts(list(slices)),
            cordoned=pods.is_cordoned(node),
        )

    def selected_by(self, selector: EnhancedNodeSelector) -> bool:
        return selector.matches(self.labels, self.allocatable, self.dra_devices)
