"""Which launcher Pod changes bring a pass of their (Node, LauncherConfig) key (controller/populator/populator.py).

The populator's Informer is loaded by hand (`upsert`, as the watch would) and no worker runs, so the key queue
shows what each change asked for. The Populator is built on an ApiClient that is never called."""

import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry

from api import keys, launcher_summary
from controller.launcher_client import LauncherClient
from controller.launcher_views import LauncherViews
from controller.populator.populator import Populator, PopulatorOptions
from tests.test_populator_fakes import NOW, launcher


@pytest.fixture
async def populator() -> AsyncIterator[Populator]:
    async with client.ApiClient() as api:
        views = LauncherViews(LauncherClient(None, None))  # type: ignore[arg-type]
        yield Populator(api, "ns", PopulatorOptions(), CollectorRegistry(), views)


def _written(pod: dict[str, Any], version: int, change: Any) -> dict[str, Any]:
    changed = copy.deepcopy(pod)
    changed["metadata"]["resourceVersion"] = str(version)
    change(changed["metadata"])
    return changed


async def _passes_asked(populator: Populator, *changes: dict[str, Any]) -> int:
    """The key passes the cache's `changes` asked for, taken from the queue as a worker would."""
    queue = populator._key_queue  # no worker runs: the queue shows what was asked
    for change in changes:
        populator._pods.upsert(change)  # as the watch loads it
    asked = 0
    while len(queue):
        key = await queue.get()
        assert key is not None
        queue.done(key)
        asked += 1
    return asked


async def test_a_summary_or_routing_label_write_queues_no_pass_and_a_binding_or_readiness_change_does(
    populator: Populator,
) -> None:
    pod = launcher("l-1", "hash-1", scheduled=NOW, ready=True)
    assert await _passes_asked(populator, pod) == 1, "a new launcher"

    summary = launcher_summary.LauncherSummary().annotation()
    summarized = _written(pod, 2, lambda m: m["annotations"].update({launcher_summary.ANNOTATION: summary}))
    warm = _written(summarized, 3, lambda m: m["labels"].update({keys.LAUNCHER_WARM_LABEL: "true"}))
    assert await _passes_asked(populator, summarized, warm) == 0

    bound = _written(warm, 4, lambda m: m["annotations"].update({keys.REQUESTER_ANNOTATION: "uid-r r"}))
    assert await _passes_asked(populator, bound) == 1
    not_ready = _written(bound, 5, lambda m: None)
    not_ready["status"]["conditions"] = [c for c in not_ready["status"]["conditions"] if c["type"] != "Ready"]
    assert await _passes_asked(populator, not_ready) == 1
