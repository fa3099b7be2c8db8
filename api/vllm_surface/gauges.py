"""vLLM's engine gauges, which every runtime exports under vLLM's names so that dashboards, the launcher and
tests written for vLLM read it unchanged: the requests running and waiting, and the sleep state."""

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge

# vLLM's `vllm:engine_sleep_state` series and the sleep level each stands for (None: awake).
SLEEP_STATES = {"awake": None, "weights_offloaded": 1, "discard_all": 2}


def export_engine_gauges(
    registry: CollectorRegistry,
    model_name: str,
    running: Callable[[], int],
    waiting: Callable[[], int],
    sleep_level: Callable[[], int | None],
) -> None:
    """Gauges read at scrape time from the engine's state, labelled as vLLM labels them."""
    labels = {"model_name": model_name, "engine": "0"}
    for name, documentation, read in (
        ("vllm:num_requests_running", "Requests being answered.", running),
        ("vllm:num_requests_waiting", "Requests queued, or held while asleep.", waiting),
    ):
        Gauge(name, documentation, list(labels), registry=registry).labels(**labels).set_function(read)
    sleep_state = Gauge(
        "vllm:engine_sleep_state",
        "awake = 1 when awake; weights_offloaded = 1 at sleep level 1; discard_all = 1 at sleep level 2.",
        [*labels, "sleep_state"],
        registry=registry,
    )
    for state, level in SLEEP_STATES.items():
        sleep_state.labels(**labels, sleep_state=state).set_function(_equals(sleep_level, level))


def _equals(read: Callable[[], int | None], value: int | None) -> Callable[[], float]:
    return lambda: float(read() == value)
