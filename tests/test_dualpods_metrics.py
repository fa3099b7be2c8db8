"""The dual-pods controller's metrics under FMA's names (issue 13 item 5): the queue-wait histogram FMA has, and
the `purpose` label of fma_http_latency_seconds as FMA spells it."""

import asyncio

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from controller.dualpods.metrics import DualPodsMetrics, Purpose
from controller.dualpods.provider_client import ProviderClient
from controller.http import HttpCaller
from kube.workqueue import WorkQueue
from tests.test_requester_proxy import HOST, serving

# FMA 0.6's dual-pods controller metrics (pkg/controller/dual-pods/controller.go), as Prometheus exposes them.
FMA_METRICS = {
    "fma_dpc_innerqueue_adds_total",
    "fma_dpc_innerqueue_depth",
    "fma_dpc_innerqueue_queue_duration_seconds",
    "fma_dpc_innerqueue_retries_total",
    "fma_dpc_innerqueue_work_duration_seconds",
    "fma_duality",
    "fma_requester_count",
    "fma_isc_count",
    "fma_actuation_seconds",
    "fma_launcher_create_seconds",
    "fma_http_latency_seconds",
}
# Every purpose FMA 0.6 times (inference-server.go's doHTTP calls and launcherclient.go).
FMA_PURPOSES = {
    "relay_ready", "relay_unready", "wake", "sleep", "query_sleeping", "get_accel_memory_usage", "get_gpu_uuids",
    "get_instance_state", "list_instances", "list_instance_ids", "delete_instance", "delete_all_instances",
    "get_health", "create_instance",
}  # fmt: skip


def exposed(registry: CollectorRegistry) -> set[str]:
    """The metric names in the Prometheus text a scrape gets."""
    text = generate_latest(registry).decode()
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def test_every_fma_metric_is_exposed_under_its_name() -> None:
    registry = CollectorRegistry()
    metrics = DualPodsMetrics(registry)
    metrics.queue_adds.labels("n").inc()
    metrics.queue_retries.labels("n").inc()
    metrics.queue_depth.labels("n").set(0)
    metrics.queue_wait_seconds.labels("n").observe(0.1)
    metrics.queue_work_seconds.labels("n").observe(0.1)
    assert FMA_METRICS - exposed(registry) == set()


def test_every_fma_purpose_has_fmas_name() -> None:
    assert FMA_PURPOSES - {purpose.value for purpose in Purpose} == set()


async def _sleeping(_: web.Request) -> web.Response:
    return web.json_response({"is_sleeping": True})


async def test_the_sleep_query_is_timed_as_query_sleeping() -> None:
    app = web.Application()
    app.router.add_get("/is_sleeping", _sleeping)
    registry = CollectorRegistry()
    async with serving(app) as port, aiohttp.ClientSession() as session:
        client = ProviderClient(HttpCaller(session, DualPodsMetrics(registry).http_latency_seconds, "ns"))
        assert await client.is_sleeping(HOST, port, "req-1")
    labels = {"purpose": "query_sleeping", "method": "GET", "exported_namespace": "ns", "isc_name": "",
              "status_code": "200"}  # fmt: skip
    assert registry.get_sample_value("fma_http_latency_seconds_count", labels) == 1


async def test_the_queue_reports_how_long_each_key_waited_from_its_first_add() -> None:
    waits: list[tuple[str, float]] = []
    queue: WorkQueue[str] = WorkQueue("test", observe_wait=lambda key, seconds: waits.append((key, seconds)))
    queue.add("a")
    await asyncio.sleep(0.05)
    queue.add("a")  # already waiting: the wait counts from the first add
    assert await queue.get() == "a"
    queue.add("a")  # while it is processed: counted from this add, handed out after done()
    await asyncio.sleep(0.02)
    queue.done("a")
    assert await queue.get() == "a"
    queue.done("a")
    assert [key for key, _ in waits] == ["a", "a"]
    assert waits[0][1] >= 0.05
    assert 0.02 <= waits[1][1] < waits[0][1] + 0.5
