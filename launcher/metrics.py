"""Prometheus metrics of the launcher (E10), in a registry of its own."""

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

_SECONDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300)
_SHORT_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class _InstancesByState(Collector):
    def __init__(self, count: Callable[[], dict[str, int]]) -> None:
        self._count = count

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily("dualpods_launcher_instances", "Instances by state.", labels=["state"])
        for state, value in sorted(self._count().items()):
            family.add_metric([state], value)
        yield family


class LauncherMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.preload_seconds = Gauge(
            "dualpods_launcher_preload_seconds",
            "Time the launcher spent importing the model-server runtime at start.",
            registry=self.registry,
        )
        self.fork_seconds = Histogram(
            "dualpods_launcher_fork_seconds",
            "Time to fork an instance.",
            buckets=_SECONDS,
            registry=self.registry,
        )
        self.ready_seconds = Histogram(
            "dualpods_launcher_instance_ready_seconds",
            "Time from an instance's creation to its first healthy answer.",
            buckets=_SECONDS,
            registry=self.registry,
        )
        self.sleep_seconds = Histogram(
            "dualpods_launcher_sleep_seconds",
            "Time to put an instance to sleep.",
            ["level"],
            buckets=_SECONDS,
            registry=self.registry,
        )
        self.wake_seconds = Histogram(
            "dualpods_launcher_wake_seconds",
            "Time to wake an instance.",
            buckets=_SECONDS,
            registry=self.registry,
        )
        self.stops = Counter(
            "dualpods_launcher_instance_stops",
            "Instances that stopped without being asked to, by why "
            "(Exited, EngineDied, Unresponsive, WakeCheckFailed).",
            ["reason"],
            registry=self.registry,
        )
        self.wake_checks = Counter(
            "dualpods_launcher_wake_checks",
            "Wakes by the outcome of their post-wake check: passed, failed (the instance was killed), unchecked "
            "(no probe was recorded: verify_wakes off, or the runtime could not answer it).",
            ["result"],
            registry=self.registry,
        )
        self.wake_check_seconds = Histogram(
            "dualpods_launcher_wake_check_seconds",
            "Time to replay an instance's probe after a wake (not in dualpods_launcher_wake_seconds).",
            buckets=_SHORT_SECONDS,
            registry=self.registry,
        )
        self.http_requests = Counter(
            "dualpods_launcher_http_requests",
            "HTTP requests served by the launcher API.",
            ["route", "method", "code"],
            registry=self.registry,
        )

    def count_instances_with(self, count: Callable[[], dict[str, int]]) -> None:
        self.registry.register(_InstancesByState(count))
