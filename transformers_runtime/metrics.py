"""Prometheus metrics in the runtime's own registry.

Where vLLM exports the same quantity, the name and labels are vLLM's (`vllm:*`, labels `model_name`
and `engine`), so dashboards and guards written for vLLM read this runtime unchanged; what vLLM has
no metric for is named `dualpods_runtime_*`. docs/api.md lists them all.
"""

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from api.vllm_surface.gauges import export_engine_gauges

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TRANSITION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self._labels = {"model_name": model_name, "engine": "0"}
        self.http_requests = Counter(
            "dualpods_runtime_http_requests",
            "HTTP requests answered, by route, method and status code.",
            ["route", "method", "code"],
            registry=self.registry,
        )
        self.http_seconds = Histogram(
            "dualpods_runtime_http_request_duration_seconds",
            "Time to answer an HTTP request (a stream: until its last byte).",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.transition_seconds = Histogram(
            "dualpods_runtime_sleep_transition_seconds",
            "Duration of POST /sleep and POST /wake_up, by operation and sleep level.",
            ["operation", "level"],
            buckets=TRANSITION_BUCKETS,
            registry=self.registry,
        )
        self.prompt_tokens = self._counter("vllm:prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = self._counter("vllm:generation_tokens", "Tokens generated.")

    def _counter(self, name: str, documentation: str) -> Counter:
        family = Counter(name, documentation, list(self._labels), registry=self.registry)
        return family.labels(**self._labels)

    def watch(
        self,
        running: Callable[[], int],
        waiting: Callable[[], int],
        sleep_level: Callable[[], int | None],
        adapters: Callable[[], int],
        load_seconds: Callable[[], float],
    ) -> None:
        """Gauges read at scrape time from the engine's state."""
        export_engine_gauges(self.registry, self._labels["model_name"], running, waiting, sleep_level)
        level_gauge = Gauge(
            "dualpods_runtime_sleep_level",
            "The sleep level (0, 1 or 2); -1 while awake.",
            registry=self.registry,
        )
        level_gauge.set_function(lambda: -1.0 if (level := sleep_level()) is None else float(level))
        Gauge("dualpods_runtime_lora_adapters", "LoRA adapters clients can name.", registry=self.registry).set_function(
            adapters
        )
        Gauge(
            "dualpods_runtime_model_load_seconds",
            "Time the last load of the weights from disk took (at start, and on a wake from level 2).",
            registry=self.registry,
        ).set_function(load_seconds)
