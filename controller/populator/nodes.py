"""The facts about a Node that population policies select on: its labels and `status.allocatable`.

A Node's status changes with every heartbeat; only a change of these facts can change which
policies select it, so only such a change is worth digesting again.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from api.selectors import EnhancedNodeSelector


@dataclass(frozen=True)
class NodeFacts:
    name: str
    labels: Mapping[str, str]
    allocatable: Mapping[str, str]

    @classmethod
    def from_k8s(cls, node: Mapping[str, Any]) -> "NodeFacts":
        return cls(
            name=node["metadata"]["name"],
            labels=dict(node["metadata"].get("labels") or {}),
            allocatable=dict((node.get("status") or {}).get("allocatable") or {}),
        )

    def selected_by(self, selector: EnhancedNodeSelector) -> bool:
        return selector.matches(self.labels, self.allocatable)
