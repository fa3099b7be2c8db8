"""`fma_launcher_pod_count{lcfg_name, phase}`: launcher Pods per LauncherConfig and phase, over all Nodes.

There is deliberately no node label (cardinality would grow with the cluster). Every phase carries an
explicit value, zeros included, while the LauncherConfig exists or any of its launchers does, so
count-based alerts need not tell "0" from "no data"; once neither remains, its series are deleted.
"""

from collections import Counter
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Gauge

from controller.populator.key import LauncherKey
from controller.populator.phases import LauncherPodPhase

NAME = "fma_launcher_pod_count"


class LauncherPodCount:
    """The gauge, fed per key and summed per LauncherConfig."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._gauge = Gauge(
            NAME,
            "Number of launcher Pods by LauncherConfig and phase (bound, unbound, stuck_scheduling, stuck_starting, "
            "stale)",
            ["lcfg_name", "phase"],
            registry=registry,
        )
        self._by_config: dict[str, dict[str, Counter[LauncherPodPhase]]] = {}  # LauncherConfig -> node -> phases
        self._configs: set[str] = set()  # the LauncherConfigs that exist

    def publish(self, key: LauncherKey, counts: Mapping[LauncherPodPhase, int]) -> None:
        """The key's launchers per phase, replacing what was published for it before."""
        nodes = self._by_config.setdefault(key.config, {})
        if sum(counts.values()):
            nodes[key.node] = Counter(counts)
        else:
            nodes.pop(key.node, None)
        if not nodes:
            del self._by_config[key.config]
        self._refresh(key.config)

    def set_config_exists(self, config: str, exists: bool) -> None:
        if exists:
            self._configs.add(config)
        else:
            self._configs.discard(config)
        self._refresh(config)

    def _refresh(self, config: str) -> None:
        nodes = self._by_config.get(config)
        if nodes is None and config not in self._configs:
            self._gauge.remove_by_labels({"lcfg_name": config})
            return
        total = sum((counts for counts in (nodes or {}).values()), Counter[LauncherPodPhase]())
        for phase in LauncherPodPhase:
            self._gauge.labels(config, phase.value).set(total[phase])
