"""The reconcile of one (Node, LauncherConfig) key against in-memory fakes: creates up to the target
from the node-specialised template, never deletes bound launchers, replaces stale ones, deletes the
surplus not-Ready and newest first, creates nothing while anything is being deleted, never creates
twice on a lagging cache, keeps hands-off while the LauncherConfig is missing or malformed, and reports the
API server's refusals of its creates by what they are."""

import dataclasses
import json
from datetime import timedelta

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from api import keys
from controller.launcher_template import launcher_config_hash
from controller.populator.digest import Digest, digest_config, digest_policy
from controller.populator.metrics import NAME
from controller.populator.refusals import (
    CREATE_FAILED,
    FORBIDDEN,
    INVALID,
    QUOTA_EXCEEDED,
    REFUSED_BY_ADMISSION,
    refusal_of,
)
from controller.populator.warmth import Warmth
from kube.workqueue import DONE
from tests.results import again, backs_off
from tests.test_populator_fakes import (
    CONFIG,
    EXPECTATION_TIMEOUT,
    KEY,
    NODE,
    NOW,
    FakeCluster,
    FakeMonotonic,
    config_manifest,
    current_hash,
    digest_for,
    launcher,
    node,
    policy_manifest,
    reconciler,
)

CURRENT = current_hash(digest_for(1))
OLDER = NOW - timedelta(minutes=5)


async def test_creates_the_target_from_the_node_specialised_template_once() -> None:
    cluster = FakeCluster()
    reconcile, expectations, _ = reconciler(cluster, digest_for(2))
    assert await reconcile(KEY) == DONE
    assert cluster.creates == 2
    for pod in cluster.pods.values():
        assert pod["metadata"]["labels"][keys.NODE_NAME_LABEL] == NODE
        assert pod["metadata"]["annotations"][keys.LAUNCHER_TEMPLATE_HASH_ANNOTATION] == CURRENT
        assert pod["metadata"]["annotations"][keys.LAUNCHER_CONFIG_HASH_ANNOTATION] == launcher_config_hash(
            CURRENT, NODE
        )
        assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": NODE}
    cluster.sync(expectations)
    await reconcile(KEY)
    assert cluster.creates == 2


async def test_a_lagging_cache_never_causes_a_second_create() -> None:
    cluster = FakeCluster()
    clock = FakeMonotonic()
    reconcile, _, _ = reconciler(cluster, digest_for(1), clock)
    await reconcile(KEY)
    clock.now += 1
    assert again(await reconcile(KEY)) == EXPECTATION_TIMEOUT - 1, "waits for the cache until the timeout"
    assert (cluster.creates, cluster.lists) == (1, 0)

    clock.now += EXPECTATION_TIMEOUT  # the cache never caught up: ask the API server
    await reconcile(KEY)
    assert (cluster.creates, cluster.lists) == (1, 1)
    await reconcile(KEY)
    assert cluster.lists == 1, "expectations were reset"


async def test_bound_launchers_are_never_deleted_and_count_toward_the_target() -> None:
    bound = launcher("bound", "older-hash", bound=True)
    cluster = FakeCluster(bound, launcher("spare", CURRENT, ready=True))
    reconcile, _, _ = reconciler(cluster, digest_for(1))
    await reconcile(KEY)
    assert cluster.names() == {"bound"}
    assert cluster.creates == 0

    at_zero = FakeCluster(bound)
    reconcile, _, _ = reconciler(at_zero, digest_for(0))
    await reconcile(KEY)
    assert at_zero.names() == {"bound"}


async def test_a_requester_annotation_that_names_no_requester_does_not_bind() -> None:
    odd = launcher("odd", "older-hash")
    odd["metadata"]["annotations"][keys.REQUESTER_ANNOTATION] = "only-a-uid"
    cluster = FakeCluster(odd)
    reconcile, _, _ = reconciler(cluster, digest_for(0))
    await reconcile(KEY)
    assert cluster.names() == set()


async def test_stale_launchers_are_replaced_once_their_deletion_is_done() -> None:
    cluster = FakeCluster(launcher("old", "older-hash", ready=True))
    cluster.graceful = True
    reconcile, expectations, _ = reconciler(cluster, digest_for(1))
    assert again(await reconcile(KEY)) == EXPECTATION_TIMEOUT
    assert cluster.creates == 0, "no old and new launchers at once"

    cluster.sync(expectations)  # the cache shows it terminating
    assert again(await reconcile(KEY)) == EXPECTATION_TIMEOUT
    assert cluster.creates == 0

    del cluster.pods["old"]  # its grace period is over
    cluster.sync(expectations)
    await reconcile(KEY)
    assert cluster.creates == 1


async def test_a_stale_launcher_whose_delete_conflicts_still_counts() -> None:
    cluster = FakeCluster(launcher("old", "older-hash"))
    cluster.conflicting.add("old")  # e.g. bound meanwhile
    reconcile, _, _ = reconciler(cluster, digest_for(1))
    assert again(await reconcile(KEY)) == EXPECTATION_TIMEOUT
    assert (cluster.names(), cluster.creates) == ({"old"}, 0)


async def test_the_surplus_goes_not_ready_and_newest_first() -> None:
    cluster = FakeCluster(
        launcher("ready-old", CURRENT, created=OLDER, ready=True),
        launcher("ready-new", CURRENT, ready=True),
        launcher("starting-old", CURRENT, created=OLDER),
        launcher("starting-new", CURRENT),
    )
    reconcile, _, _ = reconciler(cluster, digest_for(2))
    await reconcile(KEY)
    assert cluster.names() == {"ready-old", "ready-new"}
    reconcile, _, _ = reconciler(cluster, digest_for(1))
    cluster.sync()
    await reconcile(KEY)
    assert cluster.names() == {"ready-old"}


async def test_the_surplus_goes_in_order_of_least_warm_state_lost_and_says_why() -> None:
    """E13: no sleepers first, then the fewest sleeper bytes, then the least recently used; readiness and age
    only break ties."""
    cluster = FakeCluster(
        launcher("two-sleepers", CURRENT, created=OLDER, ready=True, used=OLDER),
        launcher("one-big-sleeper", CURRENT, created=OLDER, ready=True),
        launcher("one-small-sleeper-used-late", CURRENT, ready=True, used=NOW),
        launcher("one-small-sleeper-used-early", CURRENT, ready=True, used=OLDER),
        launcher("empty-old-ready", CURRENT, created=OLDER, ready=True),
    )
    cluster.warm = {
        "two-sleepers": Warmth(2, 600),
        "one-big-sleeper": Warmth(1, 500),
        "one-small-sleeper-used-late": Warmth(1, 100),
        "one-small-sleeper-used-early": Warmth(1, 100),
    }
    expected = ["empty-old-ready", "one-small-sleeper-used-early", "one-small-sleeper-used-late", "one-big-sleeper"]
    for target, gone in zip(range(4, 0, -1), expected, strict=True):
        reconcile, _, _ = reconciler(cluster, digest_for(target))
        cluster.sync()
        await reconcile(KEY)
        assert gone not in cluster.names()
        assert len(cluster.names()) == target
    assert cluster.names() == {"two-sleepers"}
    name, reason, message = cluster.notes[0]
    assert (name, reason) == ("empty-old-ready", "LauncherScaledDown")
    assert "more launchers than the target 4" in message
    assert "0 sleeping instance(s)" in message
    assert cluster.events == []


async def test_nothing_is_created_while_a_launcher_is_being_deleted() -> None:
    cluster = FakeCluster(launcher("going", CURRENT, deleting=True))
    reconcile, _, _ = reconciler(cluster, digest_for(2))
    assert again(await reconcile(KEY)) == EXPECTATION_TIMEOUT
    assert cluster.creates == 0


async def test_hands_off_while_the_launcher_config_is_missing_or_malformed() -> None:
    pods = [launcher("a", CURRENT, ready=True), launcher("b", "older-hash")]
    missing = Digest()
    missing.set_policy("policy", digest_policy(policy_manifest({CONFIG: 5})))
    malformed = digest_for(5)
    malformed.set_config(CONFIG, digest_config(config_manifest(container="sidecar"), None))
    for digest in (missing, malformed):
        cluster = FakeCluster(*pods)
        reconcile, _, registry = reconciler(cluster, digest)
        await reconcile(KEY)
        assert (cluster.names(), cluster.creates) == ({"a", "b"}, 0)
        assert registry.get_sample_value(NAME, {"lcfg_name": CONFIG, "phase": "stale"}) == 2


async def test_a_key_no_policy_asks_for_loses_its_unbound_launchers() -> None:
    cluster = FakeCluster(launcher("spare", CURRENT, ready=True), launcher("bound", CURRENT, bound=True))
    reconcile, _, _ = reconciler(cluster, digest_for(None))
    await reconcile(KEY)
    assert cluster.names() == {"bound"}


async def test_a_cordoned_node_gets_no_launcher_and_loses_none_until_it_is_uncordoned() -> None:
    """A drain evicts a cordoned Node's launchers once their sleepers are copied elsewhere (drains.py); a launcher
    made there meanwhile would wait Unschedulable, and one deleted would skip that copy."""
    cluster = FakeCluster(launcher("kept", CURRENT, ready=True), launcher("stale", "old-hash", ready=True))
    digest = digest_for(3)
    digest.set_node(NODE, dataclasses.replace(node(NODE), cordoned=True))
    reconcile, expectations, _ = reconciler(cluster, digest)
    await reconcile(KEY)
    assert cluster.names() == {"kept", "stale"}
    assert cluster.creates == 0
    digest.set_node(NODE, node(NODE))
    await reconcile(KEY)
    cluster.sync(expectations)
    await reconcile(KEY)
    assert "stale" not in cluster.names()
    assert cluster.creates == 2, "uncordoned, the Node gets its count"


async def test_a_gone_node_is_left_alone_but_still_counted() -> None:
    cluster = FakeCluster(launcher("a", CURRENT, ready=True), nodes=())
    reconcile, _, registry = reconciler(cluster, digest_for(0))
    await reconcile(KEY)
    assert cluster.names() == {"a"}
    assert registry.get_sample_value(NAME, {"lcfg_name": CONFIG, "phase": "unbound"}) == 1


QUOTA_BODY = (
    '{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403,"message":"pods '
    '\\"launcher-lc-a-x\\" is forbidden: exceeded quota: launchers, requested: pods=1, used: pods=1, limited: pods=1"}'
)


async def test_a_refused_create_is_reported_until_a_create_succeeds() -> None:
    cluster = FakeCluster()
    cluster.create_error = ApiException(status=403, reason=QUOTA_BODY)
    reconcile, _, _ = reconciler(cluster, digest_for(1))
    assert backs_off(await reconcile(KEY))  # reported, and retried with back-off
    ((key, refusal),) = cluster.refusals
    assert key == KEY
    assert refusal is not None
    assert refusal.reason == QUOTA_EXCEEDED
    assert refusal.message == "exceeded quota: launchers, requested: pods=1, used: pods=1, limited: pods=1"

    cluster.create_error = None
    assert await reconcile(KEY) == DONE
    assert cluster.creates == 1
    assert cluster.refusals[-1] == (KEY, None)


@pytest.mark.parametrize(
    ("status", "message", "reason"),
    [
        (403, 'pods "l" is forbidden: exceeded quota: q, requested: pods=1, used: pods=2, limited: pods=2',
         QUOTA_EXCEEDED),
        (403, 'pods "l" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false',
         REFUSED_BY_ADMISSION),
        (422, "pods \"l\" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' denied request: no",
         REFUSED_BY_ADMISSION),
        (400, 'admission webhook "v.example.com" denied the request: no launchers here', REFUSED_BY_ADMISSION),
        (403, 'pods is forbidden: User "system:serviceaccount:ns:sa" cannot create resource "pods"', FORBIDDEN),
        (422, 'Pod "l" is invalid: spec.containers[0].image: Required value', INVALID),
        (500, "etcdserver: request timed out", CREATE_FAILED),
    ],
)  # fmt: skip
def test_refusals_are_told_apart_by_the_api_servers_message(status: int, message: str, reason: str) -> None:
    body = json.dumps({"kind": "Status", "code": status, "message": message})
    refusal = refusal_of(ApiException(status=status, reason=body))
    assert refusal.reason == reason
    assert refusal.message == message.removeprefix('pods "l" is forbidden: '), "no generated Pod name"
