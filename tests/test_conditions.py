"""Status conditions of the three kinds (controller/conditions.py and its callers): `errors` and `Stalled`
from the same problems, `Ready` per kind, `observedGeneration`, a `lastTransitionTime` that changes only
with a condition's status (e2e/test_status_writes.py: written to the real API server only when it changes)."""

from datetime import UTC, datetime, timedelta
from typing import Any

from api import keys
from api.crds import InferenceServerConfigStatus, Status
from api.launcher_summary import of_pod
from controller.conditions import Fault, Readiness, computed, current
from controller.dualpods.isc_status import IscSnapshot, isc_status, observe_isc
from controller.populator.key import LauncherKey
from controller.populator.refusals import QUOTA_EXCEEDED, Refusal
from controller.populator.status import config_status, policy_status
from tests.test_dualpods_fakes import (
    ISC,
    LC,
    bound,
    harness,
    inst,
    isc_obj,
    launcher_obj,
    lc_obj,
    requester_obj,
    settled,
    summarized,
)
from tests.test_populator_fakes import launcher

T0 = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)
MISSING = Fault("LauncherConfigNotFound", "LauncherConfig x does not exist")


def conditions(status: Status) -> dict[str, tuple[str, str, str, str, int]]:
    return {
        c.type: (c.status, c.reason, c.message, c.last_transition_time, c.observed_generation)
        for c in status.conditions
    }


def test_problems_make_errors_and_stalled_and_unready_with_the_first_reason() -> None:
    other = Fault("InvalidSpec", "bad selector")
    status = computed(Status(), 3, [MISSING, other], Readiness(True, "Serving"), T0)
    assert status.errors == [MISSING.message, other.message]
    assert status.observed_generation == 3
    joined = f"{MISSING.message}; {other.message}"
    assert conditions(status) == {
        "Ready": ("False", "LauncherConfigNotFound", joined, "2026-12-01T10:00:00Z", 3),
        "Stalled": ("True", "LauncherConfigNotFound", joined, "2026-12-01T10:00:00Z", 3),
    }


def test_without_problems_ready_says_why_and_stalled_is_false() -> None:
    status = computed(Status(), 1, [], Readiness(False, "Starting", "0 of 2"), T0)
    assert status.errors == []
    assert conditions(status) == {
        "Ready": ("False", "Starting", "0 of 2", "2026-12-01T10:00:00Z", 1),
        "Stalled": ("False", "NoErrors", "", "2026-12-01T10:00:00Z", 1),
    }


def test_a_transition_time_changes_only_with_the_condition_status() -> None:
    first = computed(Status(), 1, [], Readiness(False, "Starting", "0 of 1"), T0)
    again = computed(first, 1, [], Readiness(False, "NoRequesters"), T1)
    assert again != first, "a new reason and message are a change"
    assert {c.last_transition_time for c in again.conditions} == {"2026-12-01T10:00:00Z"}
    assert computed(again, 1, [], Readiness(False, "NoRequesters"), T1) == again, "same world, same status"
    ready = computed(again, 2, [], Readiness(True, "Serving"), T1)
    assert conditions(ready)["Ready"] == ("True", "Serving", "", "2026-12-01T10:05:00Z", 2)
    assert conditions(ready)["Stalled"][3] == "2026-12-01T10:00:00Z"


def test_an_unreadable_status_counts_as_none() -> None:
    assert current(Status, {"status": {"conditions": [{"type": "Ready"}]}}) == Status()


def test_a_launcher_config_is_valid_or_stalled_on_its_template_error() -> None:
    config = {"metadata": {"name": "lc", "generation": 4}}
    valid = config_status(config, None, [], T0)
    assert conditions(valid)["Ready"][:2] == ("True", "Valid")
    broken = config_status(config, "LauncherConfig lc: no container named 'inference-server'", [], T0)
    assert conditions(broken)["Stalled"][:2] == ("True", "TemplateError")
    assert broken.errors == ["LauncherConfig lc: no container named 'inference-server'"]


def test_a_policy_is_populated_once_every_launcher_it_asks_for_is_ready() -> None:
    policy = {"metadata": {"name": "p", "generation": 1}}
    ready, starting = launcher("a", "h", ready=True), launcher("b", "h")
    stuck = launcher("c", "h", stuck_label=True)
    key, other = LauncherKey("n1", "lc"), LauncherKey("n2", "lc")
    cached = {key: [ready, starting], other: [stuck]}
    status = policy_status(policy, [], {key: 2, other: 1}, lambda k: cached.get(k, []), {}, T0)
    assert conditions(status)["Ready"][:3] == ("False", "Populating", "1 of 3 launchers Ready; stuck: c")
    status = policy_status(policy, [], {key: 1}, lambda k: cached.get(k, []), {}, T0)
    assert conditions(status)["Ready"][:3] == ("True", "Populated", "1 of 1 launchers Ready")
    assert conditions(policy_status(policy, [], {}, lambda k: [], {}, T0))["Ready"][:2] == ("True", "Populated")


def test_a_policy_says_why_its_launchers_are_missing() -> None:
    policy = {"metadata": {"name": "p", "generation": 1}}
    pending = launcher("a", "h")
    pending["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/2 nodes are available"}
    ]
    key, other = LauncherKey("n1", "lc"), LauncherKey("n2", "lc")
    cached = {key: [pending]}
    status = policy_status(policy, [], {key: 1}, lambda k: cached.get(k, []), {}, T0)
    assert conditions(status)["Ready"][:3] == (
        "False", "Unschedulable", "0 of 1 launchers Ready; unschedulable: a (0/2 nodes are available)"
    )  # fmt: skip
    quota = Refusal(QUOTA_EXCEEDED, "exceeded quota: q, requested: pods=1, used: pods=1, limited: pods=1")
    status = policy_status(policy, [], {key: 1, other: 1}, lambda k: cached.get(k, []), {other: quota}, T0)
    assert conditions(status)["Ready"][:3] == (
        "False",
        "QuotaExceeded",
        "0 of 2 launchers Ready; refused on node n2 (lc): exceeded quota: q, requested: pods=1, used: pods=1, "
        "limited: pods=1; unschedulable: a (0/2 nodes are available)",
    )
    # A refusal of a key whose launchers all exist (created before the quota shrank) is no longer the story.
    status = policy_status(policy, [], {key: 1}, lambda k: cached.get(k, []), {key: quota}, T0)
    assert conditions(status)["Ready"][1] == "Unschedulable"


async def isc_snapshot(*objs: dict[str, Any]) -> IscSnapshot:
    async with harness() as h:
        h.put(*objs)
        return observe_isc("ns", ISC, h.caches, {})


async def test_an_isc_is_ready_once_a_requester_of_it_is_served() -> None:
    alone = isc_status(await isc_snapshot(isc_obj(), lc_obj()), None, T0)
    assert alone is not None
    assert (conditions(alone)["Ready"][:2], alone.served_requesters) == (("False", "NoRequesters"), 0)
    waiting = isc_status(await isc_snapshot(isc_obj(), lc_obj(), requester_obj()), None, T0)
    assert waiting is not None
    assert conditions(waiting)["Ready"][:3] == ("False", "Starting", "0 of 1 requesters served")
    serving = settled(requester_obj(ready=True))
    other = requester_obj("req-2", "req-2-uid")
    launcher_pod = bound(launcher_obj(), serving, serving=True)
    status = isc_status(await isc_snapshot(isc_obj(), lc_obj(), serving, other, launcher_pod), None, T0)
    assert status is not None
    assert conditions(status)["Ready"][:3] == ("True", "Serving", "1 of 2 requesters served")
    assert (status.served_requesters, status.errors) == (1, [])
    deleting = settled(requester_obj(ready=True, deleting=True))
    assert (s := isc_status(await isc_snapshot(isc_obj(), lc_obj(), deleting), None, T0)) is not None
    assert s.served_requesters == 0, "a requester on its way out is served no more"


async def test_an_isc_and_its_launcher_config_count_their_instances_serving_and_asleep() -> None:
    one = summarized(launcher_obj("l1"), inst("a", sleeping=False), inst("b", isc="other", sleeping=True))
    two = summarized(launcher_obj("l2"), inst("c", sleeping=True), inst("d", ready=False, sleeping=False))
    status = isc_status(await isc_snapshot(isc_obj(), lc_obj(), one, two, launcher_obj("l3")), None, T0)
    assert status is not None
    assert (status.serving_instances, status.sleeping_instances) == (1, 1)
    config = config_status({"metadata": {"name": "lc", "generation": 1}}, None, map(of_pod, [one, two]), T0)
    assert (config.serving_instances, config.sleeping_instances) == (1, 2)


async def test_an_isc_shows_what_stops_its_requesters() -> None:
    missing = isc_status(await isc_snapshot(isc_obj(), requester_obj(ready=True)), None, T0)
    assert missing is not None
    assert missing.errors == [f"LauncherConfig {LC} does not exist"]
    assert conditions(missing)["Stalled"][:2] == ("True", "LauncherConfigNotFound")
    broken_lc = lc_obj()
    broken_lc["spec"]["podTemplate"]["spec"]["containers"][0]["name"] = "sidecar"
    template = isc_status(await isc_snapshot(isc_obj(), broken_lc), None, T0)
    assert template is not None
    assert conditions(template)["Stalled"][:2] == ("True", "TemplateError")
    reserved = isc_status(await isc_snapshot(isc_obj(labels={"kubernetes.io/x": "y"}), lc_obj()), None, T0)
    assert reserved is not None
    assert conditions(reserved)["Stalled"][:2] == ("True", "InvalidSpec")
    assert "reserved prefix" in reserved.errors[0]
    runtime = isc_obj(annotations={})
    runtime["metadata"]["annotations"] = {keys.RUNTIME_ANNOTATION: "tensorflow"}
    unknown = isc_status(await isc_snapshot(runtime, lc_obj()), None, T0)
    assert unknown is not None
    assert conditions(unknown)["Stalled"][:2] == ("True", "InvalidSpec")
    assert isc_status(await isc_snapshot(lc_obj()), None, T0) is None, "a gone ISC has no status to write"


async def test_the_controller_writes_an_isc_status_only_when_it_changes() -> None:
    async with harness() as h:
        h.put(isc_obj(), lc_obj(), requester_obj())
        await h.reconciler.reconcile_isc_status(ISC)
        await h.reconciler.reconcile_isc_status(ISC)
        assert [name for name, _ in h.statuses.written] == [ISC], "the second pass found it shown already"
        h.put(settled(requester_obj(ready=True, rv="2")))
        assert ("isc-status", ISC) in await h.queued(), "a requester told it is ready concerns its ISC"
        await h.reconciler.reconcile_isc_status(ISC)
        [_, (_, status)] = h.statuses.written
        assert isinstance(status, InferenceServerConfigStatus)
        assert status.served_requesters == 1
