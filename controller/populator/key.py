"""The unit of population: the launchers of one LauncherConfig on one Node, found by their labels."""

from collections.abc import Mapping
from typing import Any, NamedTuple

from api import keys


class LauncherKey(NamedTuple):
    node: str
    config: str

    def __str__(self) -> str:
        return f"{self.node}/{self.config}"


def key_fields(key: LauncherKey) -> dict[str, str]:
    """A key's log fields (the pass about it logs within them)."""
    return {"node": key.node, "launcher_config": key.config}


def launcher_key(pod: Mapping[str, Any]) -> LauncherKey | None:
    """The key of a launcher Pod, None for a Pod that is not one (or lacks its node or config label)."""
    labels = pod["metadata"].get("labels") or {}
    node, config = labels.get(keys.NODE_NAME_LABEL), labels.get(keys.LAUNCHER_CONFIG_NAME_LABEL)
    if labels.get(keys.COMPONENT_LABEL) != keys.LAUNCHER_COMPONENT or not node or not config:
        return None
    return LauncherKey(node, config)


def selector(key: LauncherKey | None = None) -> str:
    """The label selector of all launcher Pods, or of one key's."""
    terms = [f"{keys.COMPONENT_LABEL}={keys.LAUNCHER_COMPONENT}"]
    if key is not None:
        terms += [f"{keys.LAUNCHER_CONFIG_NAME_LABEL}={key.config}", f"{keys.NODE_NAME_LABEL}={key.node}"]
    return ",".join(terms)
