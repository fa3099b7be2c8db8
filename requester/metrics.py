"""Prometheus metrics of the requester (E10), in a registry of its own, served on the SPI port."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# FMA's `fma_actuation_seconds` buckets, so the two sides of an actuation can be compared.
ACTUATION_BUCKETS = (0, 1, 3, 5, 7.5, 10, 15, 30, 60, 120, 240, 480, 960, 1920)
# The proxy's own share of a request is sub-millisecond when all is well.
ADDED_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 2.5, 5)
HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)


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
            "HTTP requests served, by server (spi, probes or proxy), route, method and status code.",
            ["server", "route", "method", "code"],
            registry=self.registry,
        )
        self.guard_rejections = Counter(
            "dualpods_requester_proxy_guard_rejections",
            "Requests the proxy refused with 400 because they can never fit, by rule (context_length, kv_cache).",
            ["reason"],
            registry=self.registry,
        )
        self.overload_rejections = Counter(
            "dualpods_requester_proxy_overload_rejections",
            "Requests the proxy shed with 429 because the model server's queue was too deep.",
            registry=self.registry,
        )
        self.held = Counter(
            "dualpods_requester_proxy_held_requests",
            "Requests that arrived while the requester was not ready, by outcome (forwarded, timed_out).",
            ["outcome"],
            registry=self.registry,
        )
        self.holding = Gauge(
            "dualpods_requester_proxy_holding", "Requests being held right now.", registry=self.registry
        )
        self.hold_seconds = Histogram(
            "dualpods_requester_proxy_hold_seconds",
            "How long held requests waited for readiness (including those that timed out).",
            buckets=HOLD_BUCKETS,
            registry=self.registry,
        )
        self.added_latency = Histogram(
            "dualpods_requester_proxy_added_latency_seconds",
            "The proxy's own time per forwarded request: before the request goes upstream (parsing, guard, "
            "admission) plus relaying the response head; excludes the hold and the model server's time.",
            buckets=ADDED_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.upstream_errors = Counter(
            "dualpods_requester_proxy_upstream_errors",
            "Forwarded requests that failed upstream: connect (unreachable: 502) or broken (dropped mid-answer).",
            ["kind"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "dualpods_requester_proxy_in_flight",
            "Inference requests forwarded and not yet answered in full (the overload rule's pending).",
            registry=self.registry,
        )
