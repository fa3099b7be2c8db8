"""Which inference servers the dual-pods controller looks at after each change (controller.py's handlers).

Each change reaches the controller as it would in production: through its informer caches (loaded by
hand with their public `upsert` and `remove`) and its launcher views (the fake's `changed` and `listed`);
the test reads the keys the controller put in its work queue after the change.
"""

import asyncio
import copy
from collections.abc import AsyncIterator

import pytest

from api import keys
from controller.dualpods.controller import ISC as ISC_KEY
from controller.dualpods.controller import ISC_STATUS, REQUESTER
from controller.dualpods.direct import GPU, NOMINAL
from controller.dualpods.phases import Phase
from controller.launcher_views import LauncherView
from kube.informer import Obj
from tests.test_dualpods_fakes import (
    GPU0,
    GPU1,
    ISC,
    LAUNCHER,
    NODE,
    NS,
    PROVIDER,
    REQ,
    Harness,
    bound,
    direct_requester_obj,
    gpu_map_obj,
    harness,
    inst,
    isc_obj,
    launcher_obj,
    lc_obj,
    node_obj,
    provider_obj,
    requester_obj,
)


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async with harness() as made:
        yield made


async def change(h: Harness, old: Obj | None, new: Obj | None) -> set[tuple[str, str]]:
    """`old` in the cache (what that queued is dropped), then the change to `new` (None: deleted); the keys
    the change queued."""
    if old is not None:
        h.put(old)
    await h.queued()
    if new is None:
        assert old is not None
        h.remove(old)
    else:
        h.informer(new).upsert(copy.deepcopy(new))
    return await h.queued()


def elsewhere(pod: Obj) -> Obj:
    pod["spec"]["nodeName"] = "node-b"
    return pod


def with_rv(obj: Obj, rv: str) -> Obj:
    obj["metadata"]["resourceVersion"] = rv
    return obj


def status_write(old: Obj, new: Obj, manager: str) -> tuple[Obj, Obj]:
    """`new` as the API server makes it of `old` for a status write by `manager`: the status, the
    resourceVersion, and the time of the manager's managedFields entry, changed."""
    for obj, at in ((old, "2026-12-02T10:00:00Z"), (new, "2026-12-02T10:00:01Z")):
        obj["metadata"]["managedFields"] = [{"manager": manager, "operation": "Update", "subresource": "status",
                                             "time": at}]  # fmt: skip
    new["status"] = {"observedGeneration": 1}
    return old, new


@pytest.fixture
def requesters(h: Harness) -> None:
    """Requesters "a" and "b" on NODE ("b" with another ISC), "c" on another node."""
    h.put(requester_obj("a", "a-uid"), requester_obj("b", "b-uid", isc="isc2"), elsewhere(requester_obj("c", "c-uid")))


async def test_a_requester_change_queues_that_requester(h: Harness) -> None:
    old, new = requester_obj(), with_rv(requester_obj(ready=True), "2")
    assert await change(h, old, new) == {(REQUESTER, REQ)}


@pytest.mark.usefixtures("requesters")
async def test_a_bound_launcher_change_queues_only_its_requester(h: Harness) -> None:
    launcher = bound(launcher_obj(), requester_obj())
    queued = await change(h, launcher, with_rv(bound(launcher_obj(ready=False), requester_obj()), "2"))
    assert queued == {(REQUESTER, REQ)}


@pytest.mark.usefixtures("requesters")
async def test_a_spare_launcher_change_queues_the_requesters_on_its_node(h: Harness) -> None:
    assert await change(h, None, launcher_obj()) == {(REQUESTER, "a"), (REQUESTER, "b")}


@pytest.mark.usefixtures("requesters")
async def test_a_spare_launcher_change_leaves_out_a_requester_its_instance_serves(h: Harness) -> None:
    h.reconciler.memory.phases["a"] = Phase.SERVING  # its last pass found its instance serving
    h.reconciler.memory.phases["b"] = Phase.ASLEEP
    assert await change(h, None, launcher_obj()) == {(REQUESTER, "b")}
    h.views.changed(LAUNCHER)  # the spare launcher's instances changed
    assert await h.queued() == {(REQUESTER, "b")}


@pytest.mark.usefixtures("requesters")
async def test_a_launcher_getting_bound_queues_both_its_requester_and_its_node(h: Harness) -> None:
    queued = await change(h, launcher_obj(), with_rv(bound(launcher_obj(), requester_obj()), "2"))
    assert queued == {(REQUESTER, REQ), (REQUESTER, "a"), (REQUESTER, "b")}


@pytest.mark.usefixtures("requesters")
async def test_an_unrelated_pod_queues_nothing(h: Harness) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "ns", "uid": "w"},
           "spec": {"nodeName": NODE}, "status": {}}  # fmt: skip
    assert await change(h, None, pod) == set()
    assert h.views.tracked == []


@pytest.mark.usefixtures("requesters")
async def test_a_node_change_queues_the_requesters_on_it(h: Harness) -> None:
    queued = await change(h, node_obj(), with_rv(node_obj(unschedulable=True), "2"))
    assert queued == {(REQUESTER, "a"), (REQUESTER, "b")}


@pytest.mark.usefixtures("requesters")
async def test_an_isc_spec_change_queues_its_requesters_and_its_instance_gc(h: Harness) -> None:
    queued = await change(h, isc_obj(), isc_obj(options="--model /models/b", rv="2"))
    assert queued == {(REQUESTER, "a"), (REQUESTER, "c"), (ISC_KEY, ISC), (ISC_STATUS, ISC)}


@pytest.mark.usefixtures("requesters")
async def test_an_isc_status_change_queues_no_requester(h: Harness) -> None:
    assert await change(h, *status_write(isc_obj(), isc_obj(rv="2"), "dual-pods-controller")) == {(ISC_STATUS, ISC)}


@pytest.mark.usefixtures("requesters")
async def test_an_isc_metadata_change_queues_only_its_requesters(h: Harness) -> None:
    changed = isc_obj(rv="2")
    changed["metadata"]["labels"] = {"team": "x"}
    assert await change(h, isc_obj(), changed) == {(REQUESTER, "a"), (REQUESTER, "c"), (ISC_STATUS, ISC)}


@pytest.mark.usefixtures("requesters")
async def test_a_new_isc_queues_its_requesters(h: Harness) -> None:
    assert await change(h, None, isc_obj()) == {(REQUESTER, "a"), (REQUESTER, "c"), (ISC_STATUS, ISC)}


async def test_an_iscs_status_is_queued_once_for_a_burst_of_changes(h: Harness) -> None:
    """A wave of requesters changes an ISC's counts hundreds of times: its status is computed once, a
    moment after the first change."""
    h.controller.isc_status_settle_s = 0.2
    h.put(isc_obj())
    await h.queued()
    await asyncio.sleep(0.3)  # the ISC's own arrival, settled
    assert await h.queued() == {(ISC_STATUS, ISC)}
    for name in ("a", "b", "c"):
        h.put(requester_obj(name))
    assert (ISC_STATUS, ISC) not in await h.queued(), "not at once"
    await asyncio.sleep(0.3)
    assert await h.queued() == {(ISC_STATUS, ISC)}
    await asyncio.sleep(0.3)
    assert await h.queued() == set(), "once for the three"


@pytest.mark.usefixtures("requesters")
async def test_a_deleted_isc_queues_its_requesters_and_its_instance_gc(h: Harness) -> None:
    assert await change(h, isc_obj(), None) == {(REQUESTER, "a"), (REQUESTER, "c"), (ISC_KEY, ISC)}


@pytest.mark.usefixtures("requesters")
async def test_a_launcher_config_change_queues_the_requesters_of_its_iscs(h: Harness) -> None:
    other = isc_obj("isc2")
    other["spec"]["launcherConfigName"] = "another-lc"
    h.put(isc_obj(), other)
    queued = await change(h, lc_obj(), with_rv(lc_obj(max_instances=3), "2"))
    assert queued == {(REQUESTER, "a"), (REQUESTER, "c"), (ISC_STATUS, ISC)}, "not the other ISC's"


@pytest.mark.usefixtures("requesters")
async def test_a_launcher_config_status_change_queues_nothing(h: Harness) -> None:
    """The populator writes a LauncherConfig's counts once a second in a wave; no pass reads them."""
    h.put(isc_obj())
    await h.queued()
    assert await change(h, *status_write(lc_obj(), with_rv(lc_obj(), "2"), "launcher-populator")) == set()


@pytest.mark.usefixtures("requesters")
async def test_a_launchers_instances_changing_queues_its_requester_or_its_node(h: Harness) -> None:
    h.put(launcher_obj(), bound(launcher_obj("launcher-bound"), requester_obj()))
    await h.queued()
    h.views.changed("launcher-bound")
    assert await h.queued() == {(REQUESTER, REQ)}
    h.views.changed(LAUNCHER)
    assert await h.queued() == {(REQUESTER, "a"), (REQUESTER, "b")}
    h.views.changed("launcher-gone")
    assert await h.queued() == set()


@pytest.mark.parametrize(
    ("launcher", "address"),
    [
        (launcher_obj(ip="127.0.1.9"), "127.0.1.9"),
        (launcher_obj(ip=None, running=False), None),
        (launcher_obj(ip="127.0.1.9", running=False), None),
        (launcher_obj(ip="127.0.1.9", failed=True), None),
    ],
    ids=["running", "pending", "not running", "failed"],
)
async def test_launchers_watch_streams_are_followed_while_they_run(
    h: Harness, launcher: Obj, address: str | None
) -> None:
    await change(h, None, launcher)
    assert h.views.tracked == [(LAUNCHER, address)]


async def test_a_deleted_launchers_watch_stream_is_dropped(h: Harness) -> None:
    await change(h, launcher_obj(), None)
    assert h.views.forgotten == [LAUNCHER]


async def test_a_launcher_listed_in_full_has_its_iscs_checked_for_obsolete_instances(h: Harness) -> None:
    # After a restart the controller saw no ISC change; the first full list of each launcher is when
    # instances made from an ISC that changed meanwhile get found.
    view = LauncherView(pod_ip="127.0.1.1")
    for instance, isc in (("I1i", "isc-x"), ("I2i", "isc-y"), ("I3i", "isc-x")):
        view.instances[instance] = inst(instance, isc=isc)
    h.views.listed(LAUNCHER, view)
    assert await h.queued() == {(ISC_KEY, "isc-x"), (ISC_KEY, "isc-y")}


# ----- direct mode


@pytest.mark.usefixtures("requesters")
async def test_a_spare_direct_provider_change_queues_the_requesters_on_its_node(h: Harness) -> None:
    # e.g. a sleeper deleted for the sleeper limit: the requester waiting for its GPU memory carries on
    queued = await change(h, provider_obj(), with_rv(provider_obj(deleting=True), "2"))
    assert queued == {(REQUESTER, "a"), (REQUESTER, "b")}


async def test_a_gpu_map_change_queues_every_direct_requester(h: Harness) -> None:
    h.put(requester_obj("launcher-mode", "l-uid"), direct_requester_obj("a", "a-uid"))
    h.put(elsewhere(direct_requester_obj("c", "c-uid")))
    assert await change(h, None, gpu_map_obj()) == {(REQUESTER, "a"), (REQUESTER, "c")}


async def test_direct_providers_are_indexed_by_nominal_hash_and_gpu(h: Harness) -> None:
    provider = provider_obj(indices=("0", "1"), gpus=(GPU0, GPU1))
    h.put(provider, launcher_obj())
    digest = provider["metadata"]["annotations"][keys.NOMINAL_ANNOTATION]
    assert [p["metadata"]["name"] for p in h.caches.pods.by_index(NOMINAL, digest)] == [PROVIDER]
    for index in ("0", "1"):
        assert [p["metadata"]["name"] for p in h.caches.pods.by_index(GPU, f"{NODE} {index}")] == [PROVIDER]


async def test_fma_object_counts_follow_the_caches(h: Harness) -> None:
    h.put(requester_obj("a", "a-uid"), requester_obj("b", "b-uid", isc="isc2"), requester_obj("c", "c-uid"))
    h.put(isc_obj(), isc_obj("isc2"))
    assert h.metric("fma_requester_count", isc_name=ISC) == 2
    assert h.metric("fma_requester_count", isc_name="isc2") == 1
    assert h.metric("fma_isc_count", launcher_config_name="lc") == 2

    h.remove(requester_obj("b", "b-uid", isc="isc2"))
    h.remove(isc_obj("isc2"))
    assert h.metric("fma_requester_count", isc_name="isc2") == 0, "kept at 0, as FMA's"
    assert h.metric("fma_requester_count", isc_name=ISC) == 2
    assert h.metric("fma_isc_count", launcher_config_name="lc") == 1


def duality_of(h: Harness, requester: str, pod: str) -> float | None:
    labels = {"exported_namespace": NS, "requester_name": requester, "exported_pod": pod}
    value: float | None = h.metric("fma_duality", **labels, exported_container=keys.INFERENCE_SERVER_CONTAINER,
                                   instance_id="i", UUID=GPU0, node=NODE)  # fmt: skip
    return value


async def test_a_deleted_pods_duality_series_go_with_it(h: Harness) -> None:
    """No series left behind (issue 25): a deleted requester's, and a deleted provider's, fma_duality go."""
    for requester, launcher in (("a", "launcher-a"), ("b", "launcher-b"), ("c", "launcher-c")):
        h.controller.metrics.set_duality(1, NS, requester, launcher, keys.INFERENCE_SERVER_CONTAINER, "i", GPU0, NODE)
    h.put(requester_obj("a", "a-uid"), launcher_obj("launcher-c"))
    h.remove(requester_obj("a", "a-uid"))
    h.remove(launcher_obj("launcher-c"))
    assert duality_of(h, "a", "launcher-a") is None
    assert duality_of(h, "c", "launcher-c") is None
    assert duality_of(h, "b", "launcher-b") == 1, "the others stay"


@pytest.mark.usefixtures("requesters")
async def test_a_node_heartbeat_queues_nothing(h: Harness) -> None:
    beat = with_rv(node_obj(), "2")
    beat["status"] = {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2099-01-01T00:00:00Z"}]}
    assert await change(h, node_obj(), beat) == set()
