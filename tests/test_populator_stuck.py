"""Stuck launchers (FMA's stuck_test.go): labelled and reported once, never replaced, unlabelled on
recovery; surplus deletion still removes them; API errors propagate except NotFound."""

from datetime import timedelta
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from api import keys
from kube.workqueue import DONE
from tests.results import again
from tests.test_populator_fakes import KEY, NOW, THRESHOLDS, FakeCluster, current_hash, digest_for, launcher, reconciler

LONG_AGO = NOW - timedelta(minutes=10)
DIGEST_HASH = current_hash(digest_for(1))


def stuck_starting(name: str = "stuck", **extra: Any) -> dict[str, Any]:
    return launcher(name, DIGEST_HASH, created=LONG_AGO, scheduled=LONG_AGO, **extra)


def labelled(cluster: FakeCluster, name: str) -> bool:
    return bool(cluster.pods[name]["metadata"]["labels"].get(keys.LAUNCHER_STUCK_LABEL) == "true")


STUCK_EVENT = ("stuck", "LauncherStuck", "Launcher is stuck (stuck_starting); leaving it in place for investigation")


async def test_a_stuck_launcher_is_kept_labelled_and_reported() -> None:
    cluster = FakeCluster(stuck_starting())
    reconcile, _, _ = reconciler(cluster, digest_for(1))
    assert await reconcile(KEY) == DONE, "reporting alone asks for no requeue"
    assert cluster.names() == {"stuck"}, "not replaced"
    assert labelled(cluster, "stuck")
    assert cluster.events == [STUCK_EVENT]


async def test_an_unscheduled_launcher_is_reported_as_stuck_scheduling() -> None:
    cluster = FakeCluster(launcher("stuck", DIGEST_HASH, created=LONG_AGO))
    reconcile, _, _ = reconciler(cluster, digest_for(1))
    await reconcile(KEY)
    assert labelled(cluster, "stuck")
    assert [message for *_, message in cluster.events] == [
        "Launcher is stuck (stuck_scheduling); leaving it in place for investigation"
    ]
    assert cluster.creates == 0


async def test_the_event_is_not_repeated() -> None:
    cluster = FakeCluster(stuck_starting())
    reconcile, _, _ = reconciler(cluster, digest_for(1))
    await reconcile(KEY)
    cluster.sync()
    await reconcile(KEY)
    assert cluster.events == [STUCK_EVENT]

    already = FakeCluster(stuck_starting(stuck_label=True))
    reconcile, _, _ = reconciler(already, digest_for(1))
    await reconcile(KEY)
    assert already.events == []


async def test_the_label_goes_on_recovery_without_an_event() -> None:
    recovered = launcher("stuck", DIGEST_HASH, created=LONG_AGO, scheduled=LONG_AGO, ready=True, stuck_label=True)
    bound = launcher("bound", "older-hash", bound=True, stuck_label=True)
    cluster = FakeCluster(recovered, bound)
    reconcile, _, _ = reconciler(cluster, digest_for(2))
    await reconcile(KEY)
    assert not labelled(cluster, "stuck")
    assert not labelled(cluster, "bound"), "a stuck launcher that got bound is no longer stuck"
    assert cluster.events == []


async def test_a_healthy_launcher_is_left_alone() -> None:
    cluster = FakeCluster(launcher("fine", DIGEST_HASH, scheduled=LONG_AGO, ready=True))
    reconcile, _, _ = reconciler(cluster, digest_for(1))
    await reconcile(KEY)
    assert cluster.pods["fine"]["metadata"]["resourceVersion"] == "1", "not patched"
    assert (cluster.events, cluster.creates) == ([], 0)


async def test_a_surplus_stuck_launcher_is_deleted_not_reported() -> None:
    cluster = FakeCluster(stuck_starting())
    reconcile, _, _ = reconciler(cluster, digest_for(0))
    await reconcile(KEY)
    assert cluster.names() == set()
    assert cluster.events == []


async def test_a_launcher_whose_surplus_delete_conflicts_is_reported_on_the_next_reconcile() -> None:
    healthy = launcher("healthy", DIGEST_HASH, scheduled=LONG_AGO, ready=True)
    cluster = FakeCluster(healthy, stuck_starting())
    cluster.conflicting.add("stuck")
    reconcile, expectations, _ = reconciler(cluster, digest_for(1))
    assert again(await reconcile(KEY)) is not None, "deletions are pending: look again"
    assert cluster.names() == {"stuck"}, "the not-Ready one is picked first; the healthy one goes when it conflicts"
    assert not labelled(cluster, "stuck")
    assert cluster.events == []

    cluster.sync(expectations)
    assert await reconcile(KEY) == DONE
    assert labelled(cluster, "stuck")
    assert cluster.events == [STUCK_EVENT]


async def test_a_launcher_gone_before_its_label_patch_is_ignored() -> None:
    cluster = FakeCluster(stuck_starting())
    del cluster.pods["stuck"]  # deleted by someone else; the cache still has it
    reconcile, _, _ = reconciler(cluster, digest_for(1))
    await reconcile(KEY)
    assert cluster.events == []


@pytest.mark.parametrize("recovering", [False, True], ids=["set", "clear"])
async def test_label_patch_errors_propagate(recovering: bool) -> None:
    pod = launcher("l", DIGEST_HASH, ready=True, stuck_label=True) if recovering else stuck_starting("l")
    cluster = FakeCluster(pod)
    cluster.patch_error = ApiException(status=500, reason="etcd is unhappy")
    reconcile, _, _ = reconciler(cluster, digest_for(1))
    with pytest.raises(ApiException):
        await reconcile(KEY)
    assert cluster.events == []


async def test_the_key_is_looked_at_again_when_a_launcher_will_become_stuck() -> None:
    starting = launcher("l", DIGEST_HASH, created=LONG_AGO, scheduled=NOW - timedelta(seconds=THRESHOLDS.starting - 30))
    cluster = FakeCluster(starting)
    reconcile, _, _ = reconciler(cluster, digest_for(1))
    assert again(await reconcile(KEY)) == 30
    assert cluster.events == []
