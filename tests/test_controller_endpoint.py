"""The controllers' `/metrics` and `/healthz`: answered while the event loop is busy, failed when it stops."""

import asyncio
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from controller import endpoint
from e2e.cluster.ports import free_port


def get(port: int, path: str) -> tuple[int, str]:
    """A blocking GET, as a kubelet or Prometheus makes it; run on the loop's thread to block the loop."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


async def test_metrics_and_health_answer_while_the_loop_is_blocked() -> None:
    registry = CollectorRegistry()
    Counter("dualpods_example_total", "An example.", registry=registry).inc(3)
    port = free_port()
    async with endpoint.serve_metrics(registry, "127.0.0.1", port):
        # Each GET below runs on the loop's own thread, so the loop is blocked while it is answered.
        status, body = get(port, "/metrics")
        assert status == 200
        assert "dualpods_example_total 3.0" in body
        assert get(port, "/healthz") == (200, "ok")
        assert get(port, "/nothing")[0] == 404


async def test_health_fails_once_the_loop_has_not_run_for_the_stall_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(endpoint, "STALL_S", 0.5)
    port = free_port()
    async with endpoint.serve_metrics(CollectorRegistry(), "127.0.0.1", port):
        assert get(port, "/healthz") == (200, "ok")
        time.sleep(0.6)  # noqa: ASYNC251 -- the point: the loop blocked past the limit
        status, body = get(port, "/healthz")
        assert status == 503
        assert body.startswith("the event loop has not run for")
        await asyncio.sleep(endpoint.BEAT_S + 0.1)  # the loop runs again
        assert get(port, "/healthz") == (200, "ok")
