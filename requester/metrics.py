"""Prometheus metrics of the requester (E10), in a registry of its own, served on the SPI port."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# FMA's `fma_actuation_seconds` buckets, so the two sides of an actuation can be compared.
ACTUATION_BUCKETS = (0, 1, 3, 5, 7.5, 10, 15, 30, 60, 120, 240, 480, 960, 1920)


class RequesterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.ready = Gauge(
            "dualpods_requester_ready",
            "1 while /ready answers 200 (set by the dual-pods controller), else 0.",
            registry=self.registry,
        )
        self.first_ready_seconds = Histogram(
            "dualpods_requester_first_ready_seconds",
            "Process start to the first become-ready: the requester's view of fma_actuation_seconds.",
            buckets=ACTUATION_BUCKETS,
            registry=self.registry,
        )
        self.gpus = Gauge("dualpods_requester_gpus", "GPUs found at start.", registry=self.registry)
        self.http_requests = Counter(
            "dualpods_requester_http_requests",
            "HTTP requests served, by server (spi or probes), route, method and status code.",
            ["server", "route", "method", "code"],
            registry=self.registry,
        )
