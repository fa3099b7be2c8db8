"""The dual-pods Reconciler (fma.md §2.4-§2.10), one behaviour per test, against in-memory fakes.

Each test fills the informer caches by hand, runs one pass (or, with `drive`, passes until nothing more
happens, as the watch events of each write would), and asserts what reached the outside world: the
Pods written, created and deleted, the launcher and requester calls, the Events, the metrics. The fakes
are in tests/test_dualpods_fakes.py.

The tests of each phase's step are grouped under that phase, in the order of the phase table (ROWS in
controller/dualpods/phases.py); then the whole actuations, pass after pass across phases, and the ISC's own
pass. Direct mode's phases are in tests/test_dualpods_direct.py.
"""

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from api import keys, launcher_summary
from api.launcher import InstanceStatus, VllmConfig
from controller import pods
from controller.dualpods.binding import LAUNCHER_SEEN_RECHECK_S
from controller.dualpods.controller import REQUESTER
from controller.dualpods.devices import Device
from controller.dualpods.memory import SWEEP_S, Relayed
from controller.dualpods.passes import RELAY_RECHECK_S
from controller.dualpods.phases import Phase
from controller.dualpods.release import RELEASE_POLL_S
from controller.dualpods.requester_client import RequesterError
from controller.dualpods.requester_steps import SPI_STARTUP_RETRY_S
from controller.http import HttpError, Reply
from controller.pods import annotations, binding, labels
from kube.informer import Obj
from kube.workqueue import DONE, Problem
from tests.results import again, backs_off, terminal
from tests.test_dualpods_fakes import (
    GPU0,
    GPU1,
    ISC,
    LAUNCHER,
    LC,
    LC_LABEL,
    NODE,
    NS,
    PORT,
    REQ,
    REQ_UID,
    ROUTING_ANNOTATION,
    ROUTING_LABEL,
    WANTED,
    Harness,
    bound,
    crash_looping,
    finalizers,
    harness,
    inst,
    isc_obj,
    launcher_obj,
    lc_obj,
    node_obj,
    requester_obj,
    settled,
    status_errors,
    wanted_id,
)

INSTANCE_ANNOTATIONS = (
    keys.INSTANCE_ID_ANNOTATION,
    keys.SERVER_PORT_ANNOTATION,
    keys.VLLM_CONFIG_ANNOTATION,
    keys.ISC_ROUTING_METADATA_ANNOTATION,
)


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async with harness() as made:
        made.put(node_obj(), isc_obj(), lc_obj())
        yield made


def serving_pair(h: Harness, *, ready: bool = False, deleting: bool = False) -> tuple[Obj, Obj]:
    """A requester bound to a launcher whose instance serves, as a completed actuation leaves them."""
    requester = settled(requester_obj(ready=ready, deleting=deleting))
    launcher = bound(launcher_obj(), requester, serving=True)
    h.put(requester, launcher)
    h.views.put(launcher, inst(WANTED, sleeping=False))
    return requester, launcher


def duality(h: Harness) -> float | None:
    """fma_duality of REQ bound to LAUNCHER's instance WANTED on GPU0."""
    return h.metric(
        "fma_duality",
        exported_namespace=NS,
        requester_name=REQ,
        exported_pod=LAUNCHER,
        exported_container=keys.INFERENCE_SERVER_CONTAINER,
        instance_id=WANTED,
        UUID=GPU0,
        node=NODE,
    )


def now() -> str:
    return datetime.now(UTC).isoformat()


def refused(status: int) -> HttpError:
    return HttpError("create_instance", "http://127.0.1.1:8001/v2/vllm/instances/x", Reply(status, {"detail": "no"}))


def unreachable() -> HttpError:
    return HttpError("get_gpu_uuids", "http://127.0.0.5:8081/v1/dual-pods/accelerators", None, ConnectionRefusedError())


async def standing_problem(h: Harness, kind: str) -> None:
    """A problem that stays: the requester's ISC is missing, or its launcher refuses its instance."""
    h.put(node_obj(), lc_obj())
    if kind == "unbound":
        h.put(requester_obj())
        return
    h.put(isc_obj())
    requester = settled(requester_obj())
    del requester["metadata"]["labels"][keys.INSTANCE_LABEL]  # its instance never ran
    launcher = bound(launcher_obj(), requester)
    h.put(requester, launcher)
    h.views.put(launcher)
    h.launchers.refusal = refused(400)


def budget_actions(h: Harness, action: str) -> float | None:
    return h.metric("dualpods_sleeper_budget_actions_total", exported_namespace=NS, isc_name=ISC, action=action)


def actuations(h: Harness, path: str, deleted: int = 0) -> float | None:
    """How many actuations fma_actuation_seconds counted on `path`."""
    return h.metric(
        "fma_actuation_seconds_count", exported_namespace=NS, path=path, instancesDeleted=str(deleted), isc_name=ISC
    )


def dra_requester(h: Harness) -> Obj:
    """A requester whose GPU came through a ResourceClaim: NVIDIA's DRA driver publishes it as gpu-0 of NODE."""
    requester = requester_obj(gpus=(GPU0, GPU1))
    requester["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}]
    h.devices.names = {GPU0: Device("gpu.nvidia.com", NODE, "gpu-0"), GPU1: Device("gpu.nvidia.com", NODE, "gpu-1")}
    return requester


def device_info(h: Harness, uuid: str, device: str) -> float | None:
    """dualpods_requester_device_info of REQ's GPU `uuid`, device `device` of NVIDIA's driver on NODE."""
    labels = {"exported_namespace": NS, "requester_name": REQ, "UUID": uuid}
    return h.metric("dualpods_requester_device_info", **labels, driver="gpu.nvidia.com", pool=NODE, device=device)


# A launcher that speaks only FMA's API (issue 13.1: no sleep/wake routes, no readiness in its states).


def fma_pair(h: Harness, *, sleeping: bool | None, deleting: bool = False, serving: bool = False) -> Obj:
    """REQ bound to LAUNCHER, whose instance WANTED is reported as an FMA launcher reports it (neither
    readiness nor sleep); `sleeping`: what the views learned from the instance itself (None: it has not
    answered /health yet). Returns the launcher."""
    requester = settled(requester_obj(deleting=deleting))
    launcher = bound(launcher_obj(), requester, serving=serving)
    h.put(requester, launcher)
    view = h.views.put(launcher, inst(WANTED, ready=False, sleeping=False))
    view.extensions = False
    if sleeping is not None:
        view.learn(WANTED, sleeping)
    return launcher


# ----- GONE: no requester, no provider


async def test_both_pods_gone_does_nothing(h: Harness) -> None:
    assert await h.reconcile() == DONE
    assert h.journal == []


async def test_the_memory_of_a_requester_is_dropped_once_both_pods_are_gone(h: Harness) -> None:
    other = requester_obj("other", "other-uid")
    h.put(other)
    memory = h.reconciler.memory
    for uid in (REQ_UID, "other-uid"):
        memory.paths[uid] = "warm"
        memory.victims[uid] = 1
        memory.relayed[uid] = Relayed(True, 0, 0.0)
        memory.actuated.add(uid)
    await h.reconcile()
    assert h.journal == []
    for table in (memory.paths, memory.victims, memory.relayed, memory.actuated):
        assert set(table) == {"other-uid"}


async def test_gone_pairs_are_forgotten_at_most_once_every_sweep_interval(h: Harness) -> None:
    """A sweep reads every cached Pod; a swap wave ends thousands of pairs, and sweeps each SWEEP_S at most."""
    memory = h.reconciler.memory
    memory.paths["gone-1"] = "warm"
    await h.reconcile()
    assert "gone-1" not in memory.paths
    memory.paths["gone-2"] = "warm"
    await h.reconcile()
    assert "gone-2" in memory.paths, "no second sweep within SWEEP_S"
    memory.swept_at -= SWEEP_S
    await h.reconcile()
    assert "gone-2" not in memory.paths


# ----- CONFLICTED: several providers are bound


async def test_a_requester_bound_to_several_providers_is_a_status_error_and_neither_is_touched(h: Harness) -> None:
    req = requester_obj()
    h.put(req, bound(launcher_obj(), req), bound(launcher_obj("launcher-2"), req))
    assert backs_off(await h.reconcile())
    (error,) = status_errors(h.pod(REQ)) or []
    assert f"bound to several providers: {LAUNCHER}, launcher-2" in error
    assert h.journal.kinds() == [("event", REQ), ("update", REQ)], "the requester's Event and status alone"


# ----- DISCARDING: releasing a provider that is lost (node gone, Pod failed, container failing)


async def test_unbind_deletes_a_provider_in_trouble_instead(h: Harness) -> None:
    """Its container keeps failing: the provider is lost, deleted rather than reused."""
    requester = requester_obj(finalizer=True, deleting=True)
    h.put(requester, bound(crash_looping(launcher_obj(ready=False, restarts=2)), requester))
    await h.reconcile()
    assert h.journal.kinds() == [("delete", LAUNCHER)]
    assert h.journal[0].detail == {"uid": f"{LAUNCHER}-uid", "rv": "1"}


@pytest.mark.parametrize("lost", ["node gone", "node going", "pod failed"])
async def test_unbind_deletes_a_provider_whose_node_or_pod_is_gone(h: Harness, lost: str) -> None:
    requester = requester_obj(finalizer=True, deleting=True)
    launcher = bound(launcher_obj(failed=lost == "pod failed"), requester)
    launcher["spec"]["nodeName"] = "node-b"
    h.put(requester, launcher)
    if lost == "node going":
        h.put(node_obj("node-b", deleting=True))
    elif lost == "pod failed":
        h.put(node_obj("node-b"))
    await h.reconcile()
    assert h.journal.kinds() == [("delete", LAUNCHER)]


# ----- UNHOLDING: requester finalizer without a running provider


async def test_requester_finalizer_is_removed_when_no_provider_is_bound(h: Harness) -> None:
    h.put(requester_obj(finalizer=True))
    await h.reconcile()
    assert h.journal.kinds() == [("update", REQ)]
    assert keys.REQUESTER_FINALIZER not in finalizers(h.journal.written(REQ))


async def test_requester_finalizer_is_removed_when_the_providers_container_is_not_running(h: Harness) -> None:
    requester = requester_obj(finalizer=True)
    h.put(requester, bound(launcher_obj(running=False), requester))
    await h.reconcile()
    assert h.journal.kinds() == [("update", REQ)]
    assert keys.REQUESTER_FINALIZER not in finalizers(h.journal.written(REQ))


# ----- PROVIDER_DELETED: the provider is being deleted


async def test_provider_being_deleted_deletes_the_requester_then_releases_the_provider(h: Harness) -> None:
    requester = requester_obj(rv="7")
    h.put(requester, bound(launcher_obj(deleting=True), requester))
    await h.reconcile()
    assert h.journal.kinds() == [("delete", REQ), ("update", LAUNCHER)]
    assert h.journal[0].detail == {"uid": REQ_UID, "rv": "7"}  # exactly this incarnation
    assert keys.PROVIDER_FINALIZER not in finalizers(h.journal.written(LAUNCHER))


async def test_provider_being_deleted_with_the_requester_already_going_only_releases_the_provider(
    h: Harness,
) -> None:
    requester = requester_obj(deleting=True)
    h.put(requester, bound(launcher_obj(deleting=True), requester))
    await h.reconcile()
    assert h.journal.kinds() == [("update", LAUNCHER)]
    assert keys.PROVIDER_FINALIZER not in finalizers(h.journal.written(LAUNCHER))


# ----- UNROUTING: releasing a launcher that carries routing labels


async def test_unbind_removes_routing_labels_first_then_sleeps_then_unbinds_in_one_write(h: Harness) -> None:
    _, launcher = serving_pair(h, deleting=True)

    await h.reconcile()
    assert h.journal.kinds() == [("update", LAUNCHER)]
    first = h.journal.written(LAUNCHER)
    assert ROUTING_LABEL not in labels(first)
    expected = {k: v for k, v in labels(launcher).items() if k != ROUTING_LABEL}
    assert labels(first) == expected  # the labels only: still bound, still serving
    assert annotations(first) == annotations(launcher)

    h.journal.clear()
    await h.reconcile()
    assert h.journal.kinds() == [("sleep", WANTED), ("update", LAUNCHER), ("update", REQ)]
    unbound = h.journal.written(LAUNCHER)
    for key in (keys.REQUESTER_ANNOTATION, ROUTING_ANNOTATION, *INSTANCE_ANNOTATIONS):
        assert key not in annotations(unbound)
    assert keys.DUAL_LABEL not in labels(unbound)
    assert labels(unbound)[keys.SLEEPING_LABEL] == "true"
    assert keys.PROVIDER_FINALIZER not in finalizers(unbound)
    assert labels(unbound)[LC_LABEL] == "yes"  # the LauncherConfig's own metadata stays
    assert keys.LAUNCHER_CONFIG_HASH_ANNOTATION in annotations(unbound)
    assert keys.REQUESTER_FINALIZER not in finalizers(h.journal.written(REQ))

    assert not h.has_pod(REQ)
    assert duality(h) is None, "set to 0 at the unbind, then gone with the requester: no series left behind"

    h.journal.clear()
    assert not h.has_pod(REQ)  # its last finalizer went
    await h.reconcile()
    assert h.journal == []
    assert h.views.get(LAUNCHER) is not None
    assert h.views.views[LAUNCHER].instances[WANTED].sleeping


# ----- RELEASE_WAITING: releasing a launcher whose instances are not known, within patience


async def test_unbind_waits_while_the_launchers_instances_are_unknown(h: Harness) -> None:
    requester = requester_obj(finalizer=True, deleting=True)
    launcher = bound(launcher_obj(), requester)
    h.put(requester, launcher)
    h.views.put(launcher, synced=False)
    assert again(await h.reconcile()) == RELEASE_POLL_S  # a wait, not a failure: looked at again soon
    assert h.journal == []
    assert h.metric("dualpods_passes_total", phase="release-waiting", result="wait") == 1


# ----- RELEASING: releasing a direct provider, or an unrouted launcher whose instances are known


@pytest.mark.parametrize(
    ("why", "isc_after"),
    [("its ISC changed", isc_obj(options="--model /models/b", rv="2")), ("its ISC is gone", None)],
)
async def test_unbind_deletes_an_obsolete_awake_instance_instead_of_sleeping_it(
    h: Harness, why: str, isc_after: Obj | None
) -> None:
    requester = requester_obj(finalizer=True, deleting=True)
    launcher = bound(launcher_obj(), requester)
    h.put(requester, launcher)
    h.views.put(launcher, inst(WANTED, sleeping=False))
    if isc_after is None:
        h.remove(isc_obj())
    else:
        h.put(isc_after)
    await h.reconcile()
    assert h.journal.kinds() == [("delete_instance", WANTED), ("update", LAUNCHER), ("update", REQ)], why


async def test_unbind_deletes_a_stopped_instance(h: Harness) -> None:
    requester = requester_obj(finalizer=True, deleting=True)
    launcher = bound(launcher_obj(), requester)
    h.put(requester, launcher)
    h.views.put(launcher, inst(WANTED, stopped=True))
    await h.reconcile()
    assert h.journal.kinds() == [("delete_instance", WANTED), ("update", LAUNCHER), ("update", REQ)]


async def test_unbind_deletes_an_instance_still_loading_instead_of_waiting_for_it(h: Harness) -> None:
    # Waiting for a model load to finish just to put it to sleep would hold the requester's deletion,
    # and its GPUs in the scheduler's books, for that long.
    requester = requester_obj(finalizer=True, deleting=True)
    launcher = bound(launcher_obj(), requester)
    h.put(requester, launcher)
    h.views.put(launcher, inst(WANTED, ready=False, sleeping=False))
    await h.reconcile()
    assert h.journal.kinds() == [("delete_instance", WANTED), ("update", LAUNCHER), ("update", REQ)]


async def test_unbind_leaves_an_instance_that_already_sleeps(h: Harness) -> None:
    requester = requester_obj(finalizer=True, deleting=True)
    launcher = bound(launcher_obj(), requester)
    h.put(requester, launcher)
    h.views.put(launcher, inst(WANTED, sleeping=True))
    await h.reconcile()
    assert h.journal.kinds() == [("update", LAUNCHER), ("update", REQ)]


async def test_unbind_of_a_launcher_without_address_makes_no_launcher_call(h: Harness) -> None:
    requester = requester_obj(deleting=True)
    h.put(requester, bound(launcher_obj(ip=None, ready=False, running=False), requester))
    await h.reconcile()
    assert h.journal.kinds() == [("update", LAUNCHER)]
    assert keys.REQUESTER_ANNOTATION not in annotations(h.journal.written(LAUNCHER))


async def test_unbind_when_the_requester_is_already_gone(h: Harness) -> None:
    requester = requester_obj()
    launcher = bound(launcher_obj(), requester)
    h.put(launcher)
    h.views.put(launcher, inst(WANTED, sleeping=False))
    await h.reconcile()
    assert h.journal.kinds() == [("sleep", WANTED), ("update", LAUNCHER)]
    assert keys.REQUESTER_ANNOTATION not in annotations(h.journal.written(LAUNCHER))


async def test_unbind_keeps_a_launcher_that_restarted_and_is_not_ready_and_its_sleepers(h: Harness) -> None:
    """A NotReady spell (its node's heartbeats paused) after a past restart is no loss: the launcher and
    its sleepers stay, and it is unbound once it answers again."""
    requester = requester_obj(finalizer=True, deleting=True)
    requester["metadata"]["deletionTimestamp"] = datetime.now(UTC).isoformat()
    launcher = bound(launcher_obj(ready=False, restarts=1), requester)
    h.put(requester, launcher)
    h.views.put(launcher, inst(WANTED, sleeping=False), inst("Isleeperi", port=8006))
    await h.reconcile()
    assert h.journal.kinds() == [("sleep", WANTED), ("update", LAUNCHER), ("update", REQ)]
    assert h.views.views[LAUNCHER].instances["Isleeperi"].sleeping


async def test_a_provider_bound_to_an_earlier_requester_of_the_same_name_is_released(h: Harness) -> None:
    earlier = requester_obj(uid="earlier-uid")
    launcher = bound(launcher_obj(), earlier)
    h.put(launcher, requester_obj(uid="later-uid"))  # the pass releasing the stale binding does only that
    h.views.put(launcher, inst(WANTED))
    await h.reconcile()
    assert h.journal.kinds() == [("update", LAUNCHER)]
    assert keys.REQUESTER_ANNOTATION not in annotations(h.journal.written(LAUNCHER))


async def test_a_sleep_over_the_host_budget_first_deletes_the_least_recently_used_sleepers(h: Harness) -> None:
    h.put(lc_obj(max_instances=4, budget={"hostMemoryBytes": 100}))
    requester = requester_obj(finalizer=True, deleting=True)
    launcher = bound(launcher_obj(), requester)
    h.put(requester, launcher)
    h.views.put(
        launcher,
        inst(WANTED, sleeping=False, rss=30, gpu_bytes=20, revision=9),  # asleep it holds up to 50
        inst("Ioldi", port=8006, rss=40, revision=1),
        inst("Inewi", port=8007, rss=30, revision=5),  # 50 + 40 + 30 > 100: the oldest goes
    )
    await h.reconcile()
    assert h.journal.kinds() == [
        ("list", "127.0.1.1"),
        ("event", LAUNCHER),
        ("delete_instance", "Ioldi"),
        ("sleep", WANTED),
        ("update", LAUNCHER),
        ("update", REQ),
    ]
    assert h.journal[1].detail[:2] == ("Normal", "SleeperBudget")
    assert budget_actions(h, "deleted") == 1


async def test_an_instance_too_big_for_the_host_budget_is_deleted_instead_of_sleeping(h: Harness) -> None:
    h.put(lc_obj(budget={"hostMemoryBytes": 100}))
    requester = requester_obj(finalizer=True, deleting=True)
    launcher = bound(launcher_obj(), requester)
    h.put(requester, launcher)
    h.views.put(launcher, inst(WANTED, sleeping=False, rss=90, gpu_bytes=20))
    await h.reconcile()
    assert h.journal.kinds() == [
        ("list", "127.0.1.1"),
        ("event", LAUNCHER),
        ("delete_instance", WANTED),
        ("update", LAUNCHER),
        ("update", REQ),
    ]
    assert budget_actions(h, "deleted") == 1


async def test_an_fma_launchers_instance_is_put_to_sleep_through_vllm_at_unbind(h: Harness) -> None:
    launcher = fma_pair(h, sleeping=False, deleting=True, serving=True)
    await h.drive()
    assert [(c.kind, c.target) for c in h.journal.of("sleep")] == [("sleep", launcher["status"]["podIP"])]
    assert h.views.views[LAUNCHER].instances[WANTED].sleeping
    assert keys.REQUESTER_ANNOTATION not in annotations(h.journal.written(LAUNCHER))


async def test_an_fma_launchers_sleeper_not_yet_probed_is_asked_at_unbind_and_kept(h: Harness) -> None:
    """Right after a controller restart the views may not have probed a sleeper yet: it is not taken for a
    loading instance (which the unbind deletes)."""
    launcher = fma_pair(h, sleeping=None, deleting=True)
    h.providers.asleep[launcher["status"]["podIP"]] = True
    await h.drive()
    assert h.journal.of("delete_instance") == h.journal.of("sleep") == []
    assert [c.kind for c in h.journal.of("is_sleeping")] == ["is_sleeping"]
    assert h.views.views[LAUNCHER].instances[WANTED].sleeping
    assert keys.REQUESTER_ANNOTATION not in annotations(h.journal.written(LAUNCHER))


# ----- DEPARTING: the requester is being deleted, nothing bound, no finalizer


async def test_a_departing_requester_with_nothing_bound_is_left_to_kubernetes(h: Harness) -> None:
    h.put(requester_obj(deleting=True))
    assert await h.reconcile() == DONE
    assert h.journal == []


# ----- UNSCHEDULED: staying, no Node or its Node is being deleted


@pytest.mark.parametrize("node", ["missing", "deleting"])
async def test_nothing_happens_while_the_node_is_missing_or_going(h: Harness, node: str) -> None:
    h.remove(node_obj())
    if node == "deleting":
        h.put(node_obj(deleting=True))
    h.put(requester_obj(), launcher_obj())
    h.views.put(launcher_obj())
    assert await h.reconcile() == DONE
    assert h.journal == []


# ----- STARTING: staying, scheduled, no Pod IP yet


async def test_a_requester_without_an_ip_yet_is_left_alone(h: Harness) -> None:
    """A normal moment of a Pod's start (a deliberate departure from FMA's `no IP assigned yet` error)."""
    h.put(requester_obj(ip=None, gpus=None))
    assert await h.reconcile() == DONE
    assert h.journal == []


# ----- NEEDS_GPUS: started and valid, its GPUs not recorded
async def test_gpus_are_asked_once_and_recorded_in_the_accelerators_annotation(h: Harness) -> None:
    h.requesters.gpus = [GPU0, GPU1]
    h.put(requester_obj(gpus=None))
    assert await h.reconcile() == DONE
    # No launcher yet: one is created for it, in the same pass, and the requester is written once.
    assert h.journal.kinds() == [("gpu_uuids", REQ), ("create", "launcher-lc-1"), ("update", REQ)]
    assert annotations(h.pod(REQ))[keys.ACCELERATORS_ANNOTATION] == f"{GPU0},{GPU1}"

    h.journal.clear()
    await h.reconcile()
    assert h.journal.of("gpu_uuids") == []


async def test_an_empty_gpu_set_is_a_status_error(h: Harness) -> None:
    h.requesters.gpus = []
    h.put(requester_obj(gpus=None))
    assert backs_off(await h.reconcile())
    assert status_errors(h.pod(REQ)) == ["the assigned set of GPUs is empty"]
    assert keys.ACCELERATORS_ANNOTATION not in annotations(h.pod(REQ))


async def test_a_failed_gpu_query_is_a_status_error(h: Harness) -> None:
    h.requesters.gpus = RequesterError("the requester's GPU query failed: 500 no GPUs found")
    h.put(requester_obj(gpus=None))
    assert backs_off(await h.reconcile())
    assert status_errors(h.pod(REQ)) == ["the requester's GPU query failed: 500 no GPUs found"]


async def test_a_requester_still_starting_is_asked_for_its_gpus_again_soon(h: Harness) -> None:
    requester = requester_obj(gpus=None)
    requester["status"]["containerStatuses"][0]["state"] = {"running": {"startedAt": now()}}
    h.put(requester)
    h.requesters.gpus = unreachable()
    assert again(await h.reconcile()) == SPI_STARTUP_RETRY_S
    assert h.journal.kinds() == [("gpu_uuids", REQ)]  # no status error, no Event


async def test_a_requester_that_never_answers_is_a_status_error(h: Harness) -> None:
    h.put(requester_obj(gpus=None))  # started long ago
    h.requesters.gpus = unreachable()
    assert backs_off(await h.reconcile())
    (error,) = status_errors(h.pod(REQ)) or []
    assert error.startswith("cannot query the requester's GPUs: get_gpu_uuids: ")


async def test_the_pass_that_records_the_gpus_binds_and_writes_the_requester_once(h: Harness) -> None:
    h.put(requester_obj(gpus=None), launcher_obj())
    h.views.put(launcher_obj(), inst(WANTED, sleeping=True))
    await h.reconcile()
    assert h.journal.kinds() == [("gpu_uuids", REQ), ("update", LAUNCHER), ("update", REQ)]
    requester = h.pod(REQ)
    assert annotations(requester)[keys.ACCELERATORS_ANNOTATION] == GPU0
    assert labels(requester)[keys.DUAL_LABEL] == LAUNCHER
    assert finalizers(requester) == [keys.REQUESTER_FINALIZER]
    calls = await h.drive()
    assert [(c.kind, c.target) for c in calls] == [("wake", WANTED), ("update", LAUNCHER), ("relay", REQ)]
    assert actuations(h, "hot") == 1
    # The one launcher write that makes it an endpoint brings its instance summary up to date too.
    summary = launcher_summary.of_pod(h.pod(LAUNCHER))
    assert summary is not None
    assert [(e.id, e.state) for e in summary.instances] == [(WANTED, launcher_summary.SummaryState.SERVING)]


# ----- CORDONED: admitted, unbound on a cordoned Node


async def test_a_cordoned_node_without_provider_deletes_the_requester(h: Harness) -> None:
    h.put(node_obj(unschedulable=True), requester_obj(rv="3"), launcher_obj())
    await h.reconcile()
    assert h.journal.kinds() == [("delete", REQ)]
    assert h.journal[0].detail == {"uid": REQ_UID, "rv": "3"}


async def test_a_cordoned_node_keeps_a_bound_requester(h: Harness) -> None:
    serving_pair(h)
    h.put(node_obj(unschedulable=True))
    await h.reconcile()
    assert h.journal.of("delete") == []


# ----- UNBOUND: admitted, launcher mode, to bind


async def test_a_problem_is_a_status_error_and_an_event_once(h: Harness) -> None:
    h.remove(isc_obj())
    h.put(requester_obj())
    assert terminal(await h.reconcile())  # until the ISC changes
    assert h.journal.kinds() == [("event", REQ), ("update", REQ)]
    assert h.journal[0].detail == ("Warning", "ActuationProblem", "InferenceServerConfig isc does not exist")
    assert status_errors(h.pod(REQ)) == ["InferenceServerConfig isc does not exist"]

    h.journal.clear()
    assert terminal(await h.reconcile())  # until the ISC changes
    assert h.journal == []  # the same problem again: no second Event, no write


@pytest.mark.parametrize(
    ("missing", "message"),
    [("isc", "InferenceServerConfig isc does not exist"), ("lc", "LauncherConfig lc does not exist")],
)
async def test_a_missing_isc_or_launcher_config_is_a_status_error(h: Harness, missing: str, message: str) -> None:
    h.remove(isc_obj() if missing == "isc" else lc_obj())
    h.put(requester_obj())
    assert terminal(await h.reconcile())
    assert status_errors(h.pod(REQ)) == [message]
    assert h.journal.of("create") == []


async def test_invalid_routing_metadata_is_a_status_error_and_nothing_is_bound(h: Harness) -> None:
    h.put(isc_obj(labels={"kubernetes.io/pool": "a"}), requester_obj(), launcher_obj())
    h.views.put(launcher_obj())
    assert terminal(await h.reconcile())
    assert status_errors(h.pod(REQ)) == [
        "InferenceServerConfig isc: label key 'kubernetes.io/pool' uses a reserved prefix"
    ]
    assert [c.kind for c in h.journal] == ["event", "update"]


async def test_a_routing_label_that_the_launcher_config_already_sets_is_refused(h: Harness) -> None:
    """Unbinding removes the ISC's labels; with a shared key it would strip the LauncherConfig's own."""
    h.put(isc_obj(labels={LC_LABEL: "yes"}), requester_obj())
    result = await h.reconcile()
    assert terminal(result)
    assert f"label '{LC_LABEL}' is already on the Pod" in str(result)
    assert h.journal.of("create") == []


async def test_p1_binds_the_launcher_that_holds_the_wanted_instance(h: Harness) -> None:
    empty, holder = launcher_obj("launcher-a", ip="127.0.1.1"), launcher_obj("launcher-b", ip="127.0.1.2")
    h.put(requester_obj(), empty, holder)
    h.views.put(empty)
    h.views.put(holder, inst(WANTED), inst("Iotheri", isc="isc2", port=8006))
    await h.reconcile()
    assert h.journal.kinds() == [("update", "launcher-b"), ("update", REQ)]  # the bind, then the requester settled
    assert pods.labels(h.pod(REQ))[keys.INSTANCE_LABEL] == WANTED, "its running instance named in the same write"


async def test_the_bind_write_carries_the_binding_and_the_instance(h: Harness) -> None:
    requester = requester_obj()
    h.put(isc_obj(options="--model /models/a --max-model-len 256"), requester, launcher_obj())
    h.views.put(launcher_obj())
    await h.reconcile()
    launcher = h.journal.written(LAUNCHER)
    wanted = wanted_id(isc_obj(options="--model /models/a --max-model-len 256"))
    assert annotations(launcher)[keys.REQUESTER_ANNOTATION] == f"{REQ_UID} {REQ}"
    assert annotations(launcher)[keys.INSTANCE_ID_ANNOTATION] == wanted
    assert annotations(launcher)[keys.SERVER_PORT_ANNOTATION] == str(PORT)
    assert json.loads(annotations(launcher)[keys.VLLM_CONFIG_ANNOTATION]) == {
        "options": f"--model /models/a --max-model-len 256 --port {PORT}",
        "gpu_uuids": [GPU0],
        "annotations": {keys.INSTANCE_ISC_NAME: ISC, keys.INSTANCE_INFERENCE_PORT: str(PORT)},
        # E6: what the LauncherConfig's other maxInstances - 1 sleepers keep on the GPU, 2 GiB each.
        "gpu_sleeper_reserve_bytes": 2 * 1024**3,
        "verify_wakes": True,  # the LauncherConfig's verifyWakes (default on): the post-wake check
    }
    assert json.loads(annotations(launcher)[keys.ISC_ROUTING_METADATA_ANNOTATION]) == {
        "labels": {ROUTING_LABEL: "a"},
        "annotations": {ROUTING_ANNOTATION: "x"},
    }
    assert labels(launcher)[keys.DUAL_LABEL] == REQ
    assert keys.PROVIDER_FINALIZER in finalizers(launcher)
    # Not yet an inference endpoint: routing metadata and sleeping=false come once the instance serves.
    assert ROUTING_LABEL not in labels(launcher)
    assert ROUTING_ANNOTATION not in annotations(launcher)
    assert labels(launcher)[keys.SLEEPING_LABEL] == "true"
    # The bind's winner creates the instance in the same pass, so the requester's one write carries both its
    # binding and its instance label.
    assert h.journal.kinds() == [("update", LAUNCHER), ("create_instance", wanted), ("update", REQ)]
    assert h.journal.of("wake") == []
    assert labels(h.journal.written(REQ))[keys.DUAL_LABEL] == LAUNCHER
    assert labels(h.journal.written(REQ))[keys.INSTANCE_LABEL] == wanted


async def test_p2_binds_a_launcher_with_room_without_deleting_anything(h: Harness) -> None:
    h.put(requester_obj(), launcher_obj())
    h.views.put(launcher_obj(), inst("Iotheri", isc="isc2", port=8006))
    await h.reconcile()
    assert h.journal.kinds() == [("update", LAUNCHER), ("create_instance", WANTED), ("update", REQ)]
    assert pods.labels(h.pod(REQ))[keys.DUAL_LABEL] == LAUNCHER
    assert keys.REQUESTER_FINALIZER in pods.finalizers(h.pod(REQ))


async def test_p3_binds_first_and_then_deletes_the_port_conflict_before_creating(h: Harness) -> None:
    # The bind write is the claim; only its winner deletes instances, so two requesters choosing the
    # same launcher can never delete each other's instance.
    h.put(requester_obj(), launcher_obj())
    h.views.put(launcher_obj(), inst("Iconflicti", isc="isc2", port=PORT))
    await h.reconcile()
    assert h.journal.kinds() == [
        ("update", LAUNCHER),
        ("delete_instance", "Iconflicti"),
        ("create_instance", WANTED),
        ("update", REQ),
    ]
    assert h.journal.of("delete_instance")[0].detail == "127.0.1.1"


async def test_p3_at_the_cap_deletes_the_least_recently_used_instance(h: Harness) -> None:
    h.put(requester_obj(), launcher_obj())
    h.views.put(launcher_obj(), inst("Irecenti", port=8006, revision=7), inst("Ioldi", port=8007, revision=3))
    calls = await h.drive()
    assert [c.target for c in calls if c.kind == "delete_instance"] == ["Ioldi"]


async def test_without_any_launcher_one_is_created_already_bound(h: Harness) -> None:
    h.put(requester_obj())
    await h.reconcile()
    assert [c.kind for c in h.journal] == ["create"]
    created = h.journal[0].detail
    assert created["metadata"]["generateName"] == f"launcher-{LC}-"
    assert labels(created)[keys.COMPONENT_LABEL] == keys.LAUNCHER_COMPONENT
    assert labels(created)[keys.LAUNCHER_CONFIG_NAME_LABEL] == LC
    assert labels(created)[keys.NODE_NAME_LABEL] == "node-a"
    assert labels(created)[keys.DUAL_LABEL] == REQ
    assert labels(created)[keys.SLEEPING_LABEL] == "true"
    assert labels(created)[LC_LABEL] == "yes"
    assert annotations(created)[keys.REQUESTER_ANNOTATION] == f"{REQ_UID} {REQ}"
    assert annotations(created)[keys.INSTANCE_ID_ANNOTATION] == WANTED
    assert set(INSTANCE_ANNOTATIONS) <= set(annotations(created))
    assert keys.LAUNCHER_CONFIG_HASH_ANNOTATION in annotations(created)
    assert created["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "node-a"}
    assert finalizers(created) == [keys.PROVIDER_FINALIZER]
    assert ROUTING_LABEL not in labels(created)
    assert h.metric("fma_launcher_create_seconds_count", exported_namespace=NS, lcfg_name=LC, success="true") == 1


@pytest.mark.parametrize("starting", ["no IP", "not Ready", "instances not listed yet"])
async def test_while_a_launcher_is_starting_nothing_is_created(h: Harness, starting: str) -> None:
    launcher = launcher_obj(ip=None if starting == "no IP" else "127.0.1.1", ready=starting != "not Ready")
    h.put(requester_obj(), launcher)
    if starting != "no IP":
        h.views.put(launcher, synced=starting != "instances not listed yet")
    assert await h.reconcile() == DONE
    assert h.journal == []


async def test_bound_deleting_and_failed_launchers_are_no_candidates(h: Harness) -> None:
    other = requester_obj("other", "other-uid")
    taken = bound(launcher_obj("launcher-taken", ip="127.0.1.1"), other)
    going = launcher_obj("launcher-going", ip="127.0.1.2", deleting=True)
    failed = launcher_obj("launcher-failed", ip="127.0.1.3", failed=True)
    h.put(requester_obj(), other, taken, going, failed)
    for launcher in (taken, going, failed):
        h.views.put(launcher)
    await h.reconcile()
    assert [c.kind for c in h.journal] == ["create"]


async def test_stopped_and_portless_instances_on_a_candidate_are_deleted_and_not_counted(h: Harness) -> None:
    portless = inst("Iportlessi", port=8006).model_copy(update={"annotations": {}})
    h.put(requester_obj(), launcher_obj())
    h.views.put(launcher_obj(), inst("Istoppedi", port=8007, stopped=True), portless)
    await h.reconcile()
    assert h.journal.kinds() == [
        ("delete_instance", "Istoppedi"),
        ("delete_instance", "Iportlessi"),
        ("update", LAUNCHER),  # P2: the two did not count against maxInstances 2
        ("create_instance", WANTED),
        ("update", REQ),
    ]


async def test_a_launcher_failing_to_create_after_the_bind_leaves_the_creation_to_the_next_pass(h: Harness) -> None:
    h.put(requester_obj(), launcher_obj())
    h.views.put(launcher_obj())
    h.launchers.refusal = refused(503)
    await h.reconcile()  # the bind stands, and the requester is settled without an instance label
    assert h.journal.kinds() == [("update", LAUNCHER), ("create_instance", WANTED), ("update", REQ)]
    assert labels(h.pod(REQ))[keys.DUAL_LABEL] == LAUNCHER
    assert keys.INSTANCE_LABEL not in labels(h.pod(REQ))
    assert status_errors(h.pod(REQ)) is None
    h.launchers.refusal = None
    calls = await h.drive()  # CREATING, once the bind's event is in
    assert [(c.kind, c.target) for c in calls] == [("create_instance", WANTED), ("update", REQ)]
    assert labels(h.pod(REQ))[keys.INSTANCE_LABEL] == WANTED


async def test_an_instance_refused_after_the_bind_is_a_status_error_of_the_bound_requester(h: Harness) -> None:
    h.put(requester_obj(), launcher_obj())
    h.views.put(launcher_obj())
    h.launchers.refusal = refused(400)
    assert backs_off(await h.reconcile())
    assert labels(h.pod(REQ))[keys.DUAL_LABEL] == LAUNCHER
    (error,) = status_errors(h.pod(REQ)) or []
    assert error.startswith(f"launcher {LAUNCHER} refused the instance: ")


@pytest.mark.parametrize("kind", ["unbound", "bound"])
async def test_a_restarted_controller_neither_rewrites_a_standing_problem_nor_records_it_again(kind: str) -> None:
    ends = terminal if kind == "unbound" else backs_off  # a missing ISC waits for it; a refusal is retried
    async with harness() as before:
        await standing_problem(before, kind)
        assert ends(await before.reconcile())
        assert [c.kind for c in before.journal if c.kind != "create_instance"] == ["event", "update"]
        reported = before.pod(REQ)
        shown = status_errors(reported)
        assert shown
    async with harness() as after:  # a new controller process: its memory empty, its caches listed afresh
        await standing_problem(after, kind)
        after.put(reported)
        for _ in range(3):
            assert ends(await after.reconcile())
        assert [c.kind for c in after.journal if c.kind != "create_instance"] == []  # no write, no second Event
        assert status_errors(after.pod(REQ)) == shown


async def test_a_status_error_from_before_binding_is_cleared_once_bound(h: Harness) -> None:
    h.remove(isc_obj())
    h.put(requester_obj(), launcher_obj())
    h.views.put(launcher_obj(), inst(WANTED))
    assert terminal(await h.reconcile())
    assert status_errors(h.pod(REQ)) == ["InferenceServerConfig isc does not exist"]
    h.put(isc_obj())
    await h.drive()
    assert status_errors(h.pod(REQ)) is None
    assert h.journal.of("relay")


async def test_a_dra_requesters_bind_names_the_devices_its_instance_runs_on(h: Harness) -> None:
    h.put(dra_requester(h), launcher_obj())
    h.views.put(launcher_obj())
    await h.drive()
    (event,) = h.journal.of("event")
    wanted = wanted_id(gpus=(GPU0, GPU1))
    assert (event.target, event.detail) == (
        REQ,
        ("Normal", "Bound", f"instance {wanted} on launcher {LAUNCHER} runs on "
         f"gpu.nvidia.com/{NODE}/gpu-0 ({GPU0}), gpu.nvidia.com/{NODE}/gpu-1 ({GPU1})"),
    )  # fmt: skip
    assert (device_info(h, GPU0, "gpu-0"), device_info(h, GPU1, "gpu-1")) == (1, 1)
    h.remove(h.pod(REQ))  # the requester is deleted
    assert device_info(h, GPU0, "gpu-0") is None, "no series left behind"


async def test_a_cold_dra_bind_names_the_devices_and_the_launcher_made_for_it(h: Harness) -> None:
    h.put(dra_requester(h))
    h.devices.names.pop(GPU1)  # a GPU no driver publishes is named by its UUID alone
    await h.drive()
    (created,) = h.journal.of("create")
    (event,) = h.journal.of("event")
    assert event.detail[2].endswith(
        f"on launcher {created.target} runs on gpu.nvidia.com/{NODE}/gpu-0 ({GPU0}), {GPU1}"
    )


# ----- WAKE_FAILED: its instance failed its post-wake check (and was killed)


async def test_a_served_instance_failing_a_wake_behind_the_controllers_back_is_unrelayed_first(h: Harness) -> None:
    requester = settled(requester_obj(ready=True))
    h.put(requester, bound(launcher_obj(), requester, serving=True))
    h.views.put(launcher_obj(), inst(WANTED, wake_check_failed=True))
    await h.reconcile()
    assert h.journal.kinds() == [("relay", REQ), ("update", REQ), ("event", REQ), ("delete_instance", WANTED)]
    assert h.journal.of("relay")[0].detail is False
    assert status_errors(h.pod(REQ)) == [h.journal.of("event")[0].detail[2]]
    assert keys.INSTANCE_LABEL not in labels(h.pod(REQ))
    await h.reconcile()  # the fresh instance is made; the requester is not deleted as one that lost it
    assert h.journal.kinds()[4:] == [("create_instance", WANTED), ("update", REQ)]


# ----- LOST: the instance that served it vanished or stopped


async def test_an_instance_that_vanished_after_being_seen_deletes_the_requester(h: Harness) -> None:
    requester = requester_obj(rv="4", labels={keys.INSTANCE_LABEL: WANTED})
    launcher = bound(launcher_obj(), requester)
    h.put(requester, launcher)
    h.views.put(launcher)
    await h.reconcile()
    assert h.journal.kinds() == [("event", REQ), ("delete", REQ)]
    assert h.journal[0].detail[:2] == ("Warning", "InstanceLost")
    assert h.journal[1].detail == {"uid": REQ_UID, "rv": "4"}


async def test_a_stopped_instance_deletes_the_requester(h: Harness) -> None:
    requester = settled(requester_obj())
    launcher = bound(launcher_obj(), requester)
    h.put(requester, launcher)
    h.views.put(launcher, inst(WANTED, stopped=True))
    await h.reconcile()
    assert h.journal.kinds() == [("event", REQ), ("delete", REQ)]
    assert "stopped" in h.journal[0].detail[2]


# ----- SETTLING: bound, its metadata not in line with the binding


async def test_the_requester_is_settled_first(h: Harness) -> None:
    requester = requester_obj()
    launcher = bound(launcher_obj(), requester)
    h.put(requester, launcher)
    h.views.put(launcher, inst(WANTED))
    await h.reconcile()
    assert h.journal.kinds() == [("update", REQ)]
    settled = h.journal.written(REQ)
    assert keys.REQUESTER_FINALIZER in finalizers(settled)
    assert labels(settled)[keys.DUAL_LABEL] == LAUNCHER
    assert labels(settled)[keys.INSTANCE_LABEL] == WANTED
    assert annotations(settled)[keys.ACCELERATORS_ANNOTATION] == GPU0
    assert status_errors(settled) is None


# ----- LAUNCHER_STARTING: bound to a launcher that is not reachable


async def test_while_the_launcher_is_not_ready_only_the_requester_is_settled(h: Harness) -> None:
    requester = requester_obj()
    launcher = bound(launcher_obj(ready=False), requester)
    h.put(requester, launcher)
    h.views.put(launcher, inst(WANTED))
    calls = await h.drive()
    assert [c.kind for c in calls] == ["update"]
    assert keys.INSTANCE_LABEL not in labels(h.pod(REQ))  # not seen yet


async def test_a_pass_before_the_watch_shows_the_created_launcher_does_not_create_another(h: Harness) -> None:
    """Bound to two launchers, a requester would be stuck (conflicted) for good: the next passes wait instead."""
    h.writer.watch_lags = True
    h.put(requester_obj())
    await h.reconcile()
    (created,) = h.journal.of("create")
    for _ in range(3):
        assert again(await h.reconcile()) == LAUNCHER_SEEN_RECHECK_S
    assert len(h.journal.of("create")) == 1, "no second launcher"
    h.writer.deliver_created()
    await h.drive()
    assert len(h.journal.of("create")) == 1
    assert h.phase() not in (Phase.UNBOUND, Phase.CONFLICTED)
    bound = binding(h.pod(created.target))
    assert bound is not None
    assert bound.requester_name == REQ


# ----- RECREATING: the instance stopped before it served


async def test_a_stopped_instance_that_never_served_is_started_afresh(h: Harness) -> None:
    # E.g. it stopped on a spare launcher before this requester bound it: nothing was lost.
    requester = requester_obj()
    launcher = bound(launcher_obj(), requester)
    h.put(requester, launcher)
    h.views.put(launcher, inst(WANTED, stopped=True))
    calls = [(c.kind, c.target) for c in await h.drive()]
    assert calls.index(("delete_instance", WANTED)) < calls.index(("create_instance", WANTED))
    assert h.journal.of("delete") == []


# ----- CREATING: the instance is absent


async def test_an_absent_instance_never_known_is_created_from_the_committed_config(h: Harness) -> None:
    requester = requester_obj()
    launcher = bound(launcher_obj(), requester)
    h.put(requester, launcher)
    h.views.put(launcher)
    await h.reconcile()  # settles the requester
    h.journal.clear()
    await h.reconcile()
    assert h.journal.kinds() == [("create_instance", WANTED), ("update", REQ)]  # the instance label with it
    pod_ip, config, isc_name, requester_name = h.journal[0].detail
    committed = VllmConfig.model_validate_json(annotations(launcher)[keys.VLLM_CONFIG_ANNOTATION])
    assert (pod_ip, config, isc_name, requester_name) == ("127.0.1.1", committed, ISC, REQ)


async def test_an_instance_just_created_is_not_lost_while_its_event_is_on_the_way(h: Harness) -> None:
    """The pass after the creation (brought by the requester's instance label) may come before the launcher's
    CREATED event reaches the view: the instance the launcher answered with is there, not lost."""
    requester = requester_obj()
    launcher = bound(launcher_obj(), requester)
    h.put(requester, launcher)
    h.views.put(launcher)
    h.launchers.lagging = True
    calls = await h.drive()
    assert [c.kind for c in calls] == ["update", "create_instance", "update"]  # settled, created, labelled
    assert labels(h.pod(REQ))[keys.INSTANCE_LABEL] == WANTED
    assert h.phase() is not Phase.LOST
    h.launchers.deliver()
    assert [c.kind for c in await h.drive()] == []
    assert h.journal.of("delete") == h.journal.of("event") == []


async def test_an_instance_the_launcher_refuses_is_a_status_error(h: Harness) -> None:
    requester = requester_obj()
    launcher = bound(launcher_obj(), requester)
    h.put(requester, launcher)
    h.views.put(launcher)
    h.launchers.refusal = refused(400)
    await h.reconcile()
    assert backs_off(await h.reconcile())
    (error,) = status_errors(h.pod(REQ)) or []
    assert error.startswith(f"launcher {LAUNCHER} refused the instance: ")


async def test_a_launcher_failing_to_create_is_retried_without_status_error(h: Harness) -> None:
    requester = requester_obj()
    launcher = bound(launcher_obj(), requester)
    h.put(requester, launcher)
    h.views.put(launcher)
    h.launchers.refusal = refused(503)
    await h.reconcile()
    assert backs_off(await h.reconcile())
    assert status_errors(h.pod(REQ)) is None


async def test_a_persistent_problem_does_not_make_the_status_flap(h: Harness) -> None:
    """A refused instance must not loop: clear the status, fail again, set it, clear it... Each write
    would bring the next pass at once and reset the back-off."""
    requester = requester_obj()
    launcher = bound(launcher_obj(), requester)
    h.put(requester, launcher)
    h.views.put(launcher)
    h.launchers.refusal = refused(400)
    await h.reconcile()
    assert backs_off(await h.reconcile())
    h.journal.clear()
    for _ in range(3):
        assert backs_off(await h.reconcile())
    assert [c.kind for c in h.journal] == ["create_instance"] * 3  # no write, no Event
    assert status_errors(h.pod(REQ))


async def test_a_missing_isc_is_terminal_until_it_is_created_and_its_creation_queues_the_requester(
    h: Harness,
) -> None:
    h.remove(isc_obj())
    h.put(requester_obj(), launcher_obj())
    h.views.put(launcher_obj(), inst(WANTED))
    missing = "InferenceServerConfig isc does not exist"
    assert await h.reconcile() == Problem.of(missing, retry=False)  # the queue does not retry it
    assert [c.detail for c in h.journal.of("event")] == [("Warning", "ActuationProblem", missing)]
    assert status_errors(h.pod(REQ)) == [missing]
    await h.queued()  # what the pass's own write queued
    h.put(isc_obj())  # the ISC's watch event
    assert (REQUESTER, REQ) in await h.queued()
    assert not isinstance(await h.reconcile(), Problem)  # the requester proceeds: it binds
    assert binding(h.pod(LAUNCHER)) is not None
    await h.drive()
    assert status_errors(h.pod(REQ)) is None


async def test_a_create_that_an_earlier_pass_already_made_is_not_an_error(h: Harness) -> None:
    requester = requester_obj()
    launcher = bound(launcher_obj(), requester)
    h.put(requester, launcher)
    h.views.put(launcher)
    h.launchers.refusal = HttpError(
        "create_instance",
        "http://127.0.1.1:8001/v2/vllm/instances/x",
        Reply(409, {"detail": "Instance x already exists"}),
    )
    await h.reconcile()  # settles the requester
    assert await h.reconcile() == DONE  # the PUT answers 409: no error, no back-off
    assert h.journal.kinds()[-1][0] == "create_instance"
    assert status_errors(h.pod(REQ)) is None


async def test_the_launcher_configs_verify_wakes_goes_into_the_create_body(h: Harness) -> None:
    unchecked = lc_obj()
    unchecked["spec"]["verifyWakes"] = False
    h.put(unchecked, requester_obj(), launcher_obj())
    h.views.put(launcher_obj())
    await h.drive()
    [create] = h.journal.of("create_instance")
    assert create.detail[1].verify_wakes is False
    assert json.loads(annotations(h.pod(LAUNCHER))[keys.VLLM_CONFIG_ANNOTATION])["verify_wakes"] is False


# ----- LOADING: the instance runs, not ready


async def test_a_starting_instance_is_waited_for(h: Harness) -> None:
    requester = requester_obj()
    launcher = bound(launcher_obj(), requester)
    h.put(requester, launcher)
    h.views.put(launcher, inst(WANTED, ready=False, sleeping=False))
    calls = await h.drive()
    assert [c.kind for c in calls] == ["update"]  # the requester settled; no launcher call


async def test_an_fma_launchers_instance_not_yet_serving_is_waited_for(h: Harness) -> None:
    fma_pair(h, sleeping=None)
    await h.reconcile()
    assert h.journal.of("wake") == h.journal.of("sleep") == h.journal.of("create_instance") == []


# ----- ASLEEP: the instance is ready and sleeps


async def test_a_sleeping_instance_is_woken_and_nothing_is_written_yet(h: Harness) -> None:
    requester = requester_obj()
    launcher = bound(launcher_obj(), requester)
    h.put(requester, launcher)
    h.views.put(launcher, inst(WANTED, sleeping=True))
    await h.reconcile()  # settles
    h.journal.clear()
    await h.reconcile()
    assert h.journal.kinds() == [("wake", WANTED)]


async def test_a_wake_over_the_gpu_budget_first_deletes_the_gpus_least_recently_used_sleeper(h: Harness) -> None:
    h.put(lc_obj(max_instances=4, budget={"gpuMemoryBytes": 1024 * 1024 * 1024}))
    h.requesters.memory_mib = {GPU0: 2048}
    requester = settled(requester_obj())
    launcher = bound(launcher_obj(), requester)
    h.put(requester, launcher)
    h.views.put(
        launcher,
        inst(WANTED, sleeping=True, revision=1),
        inst("Iothergpui", port=8006, gpus=[GPU1], revision=2),
        inst("Isamegpui", port=8007, revision=3),
    )
    await h.reconcile()
    assert h.journal.kinds() == [
        ("memory_usage", REQ),
        ("list", "127.0.1.1"),
        ("event", LAUNCHER),
        ("delete_instance", "Isamegpui"),
    ]
    assert h.journal.of("wake") == []  # the DELETED event brings the next pass, and the wake
    assert (budget_actions(h, "deleted"), budget_actions(h, "wake_refused")) == (1, None)


async def test_a_wake_that_cannot_fit_the_gpu_budget_is_refused_with_a_status_error(h: Harness) -> None:
    h.put(lc_obj(budget={"gpuMemoryBytes": 1024 * 1024 * 1024}))
    h.requesters.memory_mib = {GPU0: 2048}
    requester = settled(requester_obj())
    launcher = bound(launcher_obj(), requester)
    h.put(requester, launcher)
    h.views.put(launcher, inst(WANTED, sleeping=True))
    assert backs_off(await h.reconcile())
    (error,) = status_errors(h.pod(REQ)) or []
    assert error.startswith(f"not waking instance {WANTED}: its GPUs already hold more than the sleeper budget")
    assert h.journal.of("wake") == []
    assert budget_actions(h, "wake_refused") == 1


async def test_an_fma_launchers_sleeper_is_woken_through_vllm_and_then_served(h: Harness) -> None:
    launcher = fma_pair(h, sleeping=True)
    await h.reconcile()
    assert h.journal.kinds() == [("wake", launcher["status"]["podIP"])]  # vLLM's /wake_up, not the launcher's
    assert h.journal[0].detail == PORT
    assert not h.views.views[LAUNCHER].instances[WANTED].sleeping  # recorded: no event will say so

    h.journal.clear()
    await h.reconcile()
    assert h.journal.kinds() == [("update", LAUNCHER), ("relay", REQ)]
    assert labels(h.journal.written(LAUNCHER))[keys.SLEEPING_LABEL] == "false"


# ----- MISROUTED: awake and ready, its routing metadata no longer fits the launcher


async def test_outdated_committed_routing_metadata_deletes_the_requester(h: Harness) -> None:
    requester = settled(requester_obj())
    launcher = bound(launcher_obj(), requester, routing_json='{"labels": {"kubernetes.io/pool": "a"}}')
    h.put(requester, launcher)
    h.views.put(launcher, inst(WANTED, sleeping=False))
    await h.reconcile()
    assert h.journal.kinds() == [("event", REQ), ("delete", REQ)]
    type_, reason, message = h.journal[0].detail
    assert (type_, reason) == ("Warning", "OutdatedRoutingMetadata")
    assert "kubernetes.io/pool" in message
    assert h.journal.of("relay") == []


# ----- SERVING: awake and ready, its routing metadata fits


async def test_a_cleared_problem_clears_the_status(h: Harness) -> None:
    serving_pair(h)
    h.requesters.relay_error = RequesterError("relaying readiness to the requester failed: refused")
    assert backs_off(await h.reconcile())
    assert status_errors(h.pod(REQ)) == ["relaying readiness to the requester failed: refused"]
    h.requesters.relay_error = None
    await h.drive()
    assert status_errors(h.pod(REQ)) is None


async def test_an_awake_instance_makes_the_launcher_an_endpoint_in_one_write_and_relays_once(h: Harness) -> None:
    requester = settled(requester_obj())
    launcher = bound(launcher_obj(), requester)
    h.put(requester, launcher)
    h.views.put(launcher, inst(WANTED, sleeping=False))
    assert again(await h.reconcile()) == RELAY_RECHECK_S
    assert h.journal.kinds() == [("update", LAUNCHER), ("relay", REQ)]
    serving = h.journal.written(LAUNCHER)
    assert labels(serving)[keys.SLEEPING_LABEL] == "false"
    assert labels(serving)[ROUTING_LABEL] == "a"
    assert annotations(serving)[ROUTING_ANNOTATION] == "x"
    assert h.journal[1].detail is True
    assert actuations(h, "hot") == 1  # no path remembered (as after a restart): hot
    assert duality(h) == 1

    h.journal.clear()
    after_s = again(await h.reconcile())  # within the recheck window: not re-sent, and measured once only
    assert h.journal == []
    assert after_s is not None
    assert 0 < after_s <= RELAY_RECHECK_S
    assert actuations(h, "hot") == 1


async def test_readiness_is_not_relayed_to_a_requester_already_ready(h: Harness) -> None:
    serving_pair(h, ready=True)
    calls = await h.drive()
    assert [c.kind for c in calls] == []


# ----- whole actuations, pass after pass, across the phases (the fma_actuation_seconds path label)


async def test_a_hot_actuation_binds_wakes_serves_and_relays(h: Harness) -> None:
    h.put(requester_obj(), launcher_obj())
    h.views.put(launcher_obj(), inst(WANTED, sleeping=True))
    calls = await h.drive()
    assert [(c.kind, c.target) for c in calls] == [
        ("update", LAUNCHER),  # bind
        ("update", REQ),  # settle
        ("wake", WANTED),
        ("update", LAUNCHER),  # serving
        ("relay", REQ),
    ]
    assert actuations(h, "hot") == 1
    assert actuations(h, "warm") is None


async def test_a_wake_that_fails_its_check_is_never_served_and_a_fresh_instance_is_made(h: Harness) -> None:
    h.put(requester_obj(), launcher_obj())
    h.views.put(launcher_obj(), inst(WANTED, sleeping=True))
    h.launchers.corrupt.add(WANTED)
    calls = await h.drive()
    assert [(c.kind, c.target) for c in calls] == [
        ("update", LAUNCHER),  # bind
        ("update", REQ),  # settle
        ("wake", WANTED),  # 502 WakeCheckFailed: the launcher killed the instance
        ("update", REQ),  # unserved (no instance label), the status error
        ("event", REQ),  # WakeCheckFailed
        ("delete_instance", WANTED),  # the dead instance goes...
        ("create_instance", WANTED),  # ...and a fresh one is made for the same requester
        ("update", REQ),  # the status clean and the fresh instance's label, in the pass that created it
    ]
    assert [c.detail[1] for c in h.journal.of("event")] == ["WakeCheckFailed"]
    error = h.journal.of("event")[0].detail[2]
    assert status_errors(h.journal.of("update")[2].detail) == [error]
    assert "failed its post-wake check (token 0: 464 instead of 198)" in h.journal.of("event")[0].detail[2]
    assert h.metric("dualpods_wake_check_failures_total", exported_namespace=NS, isc_name=ISC) == 1
    assert h.journal.of("relay") == [], "never told ready on the corrupt instance"
    fresh = h.views.views[LAUNCHER].instances[WANTED]
    assert (fresh.status, fresh.stop_reason, fresh.sleeping) == (InstanceStatus.RUNNING, None, False)
    h.views.views[LAUNCHER].instances[WANTED] = fresh.model_copy(update={"ready": True})  # its READY event
    calls = await h.drive()
    assert [(c.kind, c.detail) for c in calls if c.kind == "relay"] == [("relay", True)]
    assert actuations(h, "hot") == 1


async def test_a_warm_actuation_reclaims_creates_and_serves(h: Harness) -> None:
    h.put(requester_obj(), launcher_obj())
    h.views.put(launcher_obj(), inst("Iconflicti", isc="isc2", port=PORT))
    calls = await h.drive()
    assert [(c.kind, c.target) for c in calls] == [
        ("update", LAUNCHER),  # bind
        ("delete_instance", "Iconflicti"),  # room for the instance, made by the binding's owner
        ("create_instance", WANTED),
        ("update", REQ),  # its binding and its instance label, in one write
    ]
    h.views.views[LAUNCHER].instances[WANTED] = (
        h.views.views[LAUNCHER].instances[WANTED].model_copy(update={"ready": True})
    )  # its READY event
    calls = await h.drive()
    assert [c.kind for c in calls] == ["update", "relay"]
    assert actuations(h, "warm", deleted=1) == 1
    assert actuations(h, "hot") is None


async def test_a_cold_actuation_creates_a_launcher_then_the_instance(h: Harness) -> None:
    h.put(requester_obj())
    calls = await h.drive()
    assert [c.kind for c in calls] == ["create", "update"]  # created bound; the requester settled
    (created,) = h.journal.of("create")
    name = created.target
    launcher = h.pod(name)
    started = launcher_obj(name)
    launcher["status"] = started["status"]
    launcher["metadata"]["resourceVersion"] = "500"
    h.put(launcher)
    h.views.put(launcher)
    calls = await h.drive()
    assert [c.kind for c in calls] == ["update", "create_instance", "update"]  # finalizer, PUT, instance label
    h.views.views[name].instances[WANTED] = h.views.views[name].instances[WANTED].model_copy(update={"ready": True})
    calls = await h.drive()
    assert [c.kind for c in calls] == ["update", "relay"]
    assert actuations(h, "cold") == 1
    assert actuations(h, "warm") is None


# ----- not a requester's phase: instances of a changed ISC (§2.8), the ISC's own pass


async def test_isc_change_deletes_only_idle_obsolete_unbound_instances_of_that_isc(h: Harness) -> None:
    old_isc = isc_obj()
    new_isc = isc_obj(options="--model /models/b", rv="2")
    old_gpu1 = wanted_id(old_isc, [GPU1])
    current = wanted_id(new_isc)
    requester = requester_obj("other", "other-uid", gpus=[GPU1])
    spare = launcher_obj("launcher-spare", ip="127.0.1.1")
    taken = bound(launcher_obj("launcher-taken", ip="127.0.1.2"), requester, isc=old_isc, gpus=[GPU1])
    h.put(new_isc, requester, spare, taken)
    h.views.put(
        spare,
        inst(WANTED, sleeping=True, revision=1),  # obsolete, sleeping: goes
        inst("Istoppedi", stopped=True, gpus=[GPU1], port=8009, revision=2),  # obsolete, stopped: goes
        inst(current, sleeping=True, port=8006, revision=3),  # current: stays
        inst("Iawakei", sleeping=False, port=8007, revision=4),  # obsolete but awake: at unbind
        inst("Iisc2i", isc="isc2", port=8008, revision=5),  # another ISC's
    )
    h.views.put(taken, inst(old_gpu1, gpus=[GPU1], sleeping=True))  # the bound instance itself stays
    assert await h.reconciler.reconcile_isc(ISC) == DONE
    assert set(h.journal.kinds()) == {("delete_instance", "Istoppedi"), ("delete_instance", WANTED)}
    assert len(h.journal) == 2


async def test_isc_deletion_deletes_its_idle_instances(h: Harness) -> None:
    h.remove(isc_obj())
    h.put(launcher_obj())
    h.views.put(launcher_obj(), inst(WANTED), inst("Iisc2i", isc="isc2", port=8006))
    await h.reconciler.reconcile_isc(ISC)
    assert h.journal.kinds() == [("delete_instance", WANTED)]


async def test_isc_change_skips_launchers_whose_instances_are_unknown(h: Harness) -> None:
    h.put(isc_obj(options="--model /models/b", rv="2"), launcher_obj())
    h.views.put(launcher_obj(), inst(WANTED), synced=False)
    await h.reconciler.reconcile_isc(ISC)
    assert h.journal == []
