"""Prometheus metrics of the launcher (E10), in a registry of its own."""

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

_SECONDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300)
_BYTES_PER_SECOND = tuple(float(f"{m}e{e}") for e in range(6, 12) for m in (1, 2.5, 5))  # 1 MB/s to 500 GB/s
_SHORT_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class _InstancesByState(Collector):
    def __init__(self, count: Callable[[], dict[str, int]]) -> None:
        self._count = count

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily("dualpods_launcher_instances", "Instances by state.", labels=["state"])
        for state, value in sorted(self._count().items()):
            family.add_metric([state], value)
        yield family


@dataclass(frozen=True)
class ZygoteSample:
    runtime: str
    ready: bool
    memory: dict[str, int]  # rss, uss, pss; empty while it has no process


class _Zygotes(Collector):
    def __init__(self, sample: Callable[[], list[ZygoteSample]]) -> None:
        self._sample = sample

    def collect(self) -> Iterable[GaugeMetricFamily]:
        samples = sorted(self._sample(), key=lambda s: s.runtime)
        ready = GaugeMetricFamily(
            "dualpods_launcher_zygote_ready",
            "1 while the runtime's zygote is ready to fork instances, else 0 (instances fork from the launcher).",
            labels=["runtime"],
        )
        memory = GaugeMetricFamily(
            "dualpods_launcher_zygote_memory_bytes",
            "Memory of each runtime's zygote: rss, uss (what it alone holds), pss (its share of what it shares).",
            labels=["runtime", "kind"],
        )
        for each in samples:
            ready.add_metric([each.runtime], float(each.ready))
            for kind, value in sorted(each.memory.items()):
                memory.add_metric([each.runtime, kind], value)
        yield ready
        yield memory


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
        self.forks = Counter(
            "dualpods_launcher_instance_forks",
            "Instances started, by runtime and by what forked them (zygote, or launcher: no zygote was ready).",
            ["runtime", "via"],
            registry=self.registry,
        )
        self.zygote_restarts = Counter(
            "dualpods_launcher_zygote_restarts",
            "Zygotes started again after they died.",
            ["runtime"],
            registry=self.registry,
        )
        self.startup_phase_seconds = Histogram(
            "dualpods_launcher_startup_phase_seconds",
            "Start-up time of instances by phase (fork, engine_config, weights_load, kv_cache_profiling, warmup, "
            "api_listening, first_healthy), from the marks in their own logs.",
            ["phase", "runtime"],
            buckets=_SHORT_SECONDS,
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
        self.sleep_bytes_per_second = Histogram(
            "dualpods_launcher_sleep_bytes_per_second",
            "Bytes a sleep moved (as the runtime reports them: vLLM's 'freed', the transformers runtime's weights "
            "offloaded) per second of the sleep.",
            ["level"],
            buckets=_BYTES_PER_SECOND,
            registry=self.registry,
        )
        self.wake_bytes_per_second = Histogram(
            "dualpods_launcher_wake_bytes_per_second",
            "Bytes a wake moved back per second of the wake (the bytes its level-1 sleep reported moving out).",
            buckets=_BYTES_PER_SECOND,
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

    def sample_zygotes_with(self, sample: Callable[[], list[ZygoteSample]]) -> None:
        self.registry.register(_Zygotes(sample))
