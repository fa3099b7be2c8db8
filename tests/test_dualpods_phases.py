"""The classifier of the inference server's phases (controller/dualpods/phases.py): one table row per phase,
a property test that every snapshot has exactly one phase, and the drawing in docs/architecture.md.

Snapshots are observed, as a pass observes them, from the controller's caches loaded by hand and the fake
launcher views (tests/test_dualpods_fakes.py).
"""

import re
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api import keys
from api.launcher import InstanceState
from controller.dualpods.phases import ROWS, Phase, classify, edges, mermaid
from controller.dualpods.snapshot import UNBIND_PATIENCE_S, Snapshot, observe
from controller.informer import Obj
from tests.phase_transitions import RECORDER, TransitionRecorder, UndeclaredTransition
from tests.test_dualpods_fakes import (
    LAUNCHER,
    NS,
    REQ,
    WANTED,
    Harness,
    bound,
    crash_looping,
    direct_requester_obj,
    harness,
    inst,
    isc_obj,
    launcher_obj,
    lc_obj,
    node_obj,
    provider_obj,
    requester_obj,
    settled,
)

ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async with harness() as made:
        made.put(node_obj(), isc_obj(), lc_obj())
        yield made


def snapshot(h: Harness) -> Snapshot:
    return observe(NS, REQ, h.caches, h.views)


def long_ago(pod: Obj) -> Obj:
    """Deleted long enough ago that a release's patience ran out."""
    stamp = datetime.now(UTC) - timedelta(seconds=UNBIND_PATIENCE_S + 5)
    pod["metadata"]["deletionTimestamp"] = stamp.isoformat()
    return pod


def serving(h: Harness, *, state: InstanceState | bool | None = None, deleting: bool = False) -> tuple[Obj, Obj]:
    """A served requester; `state` the instance its launcher reports (None: awake; False: none)."""
    req = settled(requester_obj(deleting=deleting))
    launcher = bound(launcher_obj(), req, serving=True)
    h.put(req, launcher)
    found = inst(WANTED, sleeping=False) if state is None else state
    h.views.put(launcher, *([found] if isinstance(found, InstanceState) else []))
    return req, launcher


def unsettled_pair(h: Harness, *instances: InstanceState) -> None:
    req = requester_obj()
    pod = bound(launcher_obj(), req)
    h.put(req, pod)
    h.views.put(pod, *instances)


def setup_gone(h: Harness) -> None:
    pass


def setup_conflicted(h: Harness) -> None:
    req = requester_obj()
    h.put(req, bound(launcher_obj(), req), bound(launcher_obj("launcher-2"), req))


def setup_discarding(h: Harness) -> None:
    req = requester_obj(finalizer=True, deleting=True)
    h.put(req, bound(crash_looping(launcher_obj(ready=False)), req))


def setup_unholding(h: Harness) -> None:
    h.put(requester_obj(finalizer=True))


def setup_provider_deleted(h: Harness) -> None:
    req = requester_obj()
    h.put(req, bound(launcher_obj(deleting=True), req))


def setup_unrouting(h: Harness) -> None:
    serving(h, deleting=True)


def setup_release_waiting(h: Harness) -> None:
    req = requester_obj(finalizer=True, deleting=True)
    pod = bound(launcher_obj(), req)
    h.put(req, pod)
    h.views.put(pod, synced=False)


def setup_releasing(h: Harness) -> None:
    req = long_ago(requester_obj(finalizer=True, deleting=True))
    pod = bound(launcher_obj(), req)
    h.put(req, pod)
    h.views.put(pod, synced=False)  # unknown, but patience ran out


def setup_departing(h: Harness) -> None:
    h.put(requester_obj(deleting=True))


def setup_unscheduled(h: Harness) -> None:
    h.remove(node_obj())
    h.put(requester_obj())


def setup_starting(h: Harness) -> None:
    h.put(requester_obj(ip=None, gpus=None))


def setup_invalid(h: Harness) -> None:
    req = direct_requester_obj()
    req["metadata"]["annotations"][keys.INFERENCE_SERVER_CONFIG_ANNOTATION] = "isc"
    h.put(req)


def setup_needs_gpus(h: Harness) -> None:
    h.put(requester_obj(gpus=None))


def setup_cordoned(h: Harness) -> None:
    h.put(node_obj(unschedulable=True), requester_obj())


def setup_acquiring(h: Harness) -> None:
    h.put(direct_requester_obj())


def setup_unbound(h: Harness) -> None:
    h.put(requester_obj())


def setup_wake_failed(h: Harness) -> None:
    serving(h, state=inst(WANTED, wake_check_failed=True))


def setup_lost(h: Harness) -> None:
    serving(h, state=False)  # served, and the launcher no longer reports the instance


def setup_settling(h: Harness) -> None:
    unsettled_pair(h, inst(WANTED))


def setup_direct_serving(h: Harness) -> None:
    req = direct_requester_obj(finalizer=True, labels={keys.DUAL_LABEL: "provider-1"})
    h.put(req, provider_obj(bound_to=req, sleeping="false"))


def setup_launcher_starting(h: Harness) -> None:
    req = settled(requester_obj())
    h.put(req, bound(launcher_obj(ready=False), req))


def setup_recreating(h: Harness) -> None:
    req = requester_obj(finalizer=True, labels={keys.DUAL_LABEL: LAUNCHER})
    pod = bound(launcher_obj(), req)
    h.put(req, pod)
    h.views.put(pod, inst(WANTED, stopped=True))


def setup_creating(h: Harness) -> None:
    req = requester_obj(finalizer=True, labels={keys.DUAL_LABEL: LAUNCHER})
    pod = bound(launcher_obj(), req)
    h.put(req, pod)
    h.views.put(pod)


def setup_loading(h: Harness) -> None:
    serving(h, state=inst(WANTED, ready=False, sleeping=False))


def setup_asleep(h: Harness) -> None:
    serving(h, state=inst(WANTED, sleeping=True))


def setup_misrouted(h: Harness) -> None:
    req = settled(requester_obj())
    pod = bound(launcher_obj(), req, routing_json='{"labels": {"kubernetes.io/pool": "a"}}')
    h.put(req, pod)
    h.views.put(pod, inst(WANTED, sleeping=False))


def setup_serving(h: Harness) -> None:
    serving(h)


TABLE: dict[Phase, Callable[[Harness], None]] = {
    Phase.GONE: setup_gone,
    Phase.CONFLICTED: setup_conflicted,
    Phase.DISCARDING: setup_discarding,
    Phase.UNHOLDING: setup_unholding,
    Phase.PROVIDER_DELETED: setup_provider_deleted,
    Phase.UNROUTING: setup_unrouting,
    Phase.RELEASE_WAITING: setup_release_waiting,
    Phase.RELEASING: setup_releasing,
    Phase.DEPARTING: setup_departing,
    Phase.UNSCHEDULED: setup_unscheduled,
    Phase.STARTING: setup_starting,
    Phase.INVALID: setup_invalid,
    Phase.NEEDS_GPUS: setup_needs_gpus,
    Phase.CORDONED: setup_cordoned,
    Phase.ACQUIRING: setup_acquiring,
    Phase.UNBOUND: setup_unbound,
    Phase.WAKE_FAILED: setup_wake_failed,
    Phase.LOST: setup_lost,
    Phase.SETTLING: setup_settling,
    Phase.DIRECT_SERVING: setup_direct_serving,
    Phase.LAUNCHER_STARTING: setup_launcher_starting,
    Phase.RECREATING: setup_recreating,
    Phase.CREATING: setup_creating,
    Phase.LOADING: setup_loading,
    Phase.ASLEEP: setup_asleep,
    Phase.MISROUTED: setup_misrouted,
    Phase.SERVING: setup_serving,
}


def test_the_table_covers_every_phase_and_every_phase_has_a_rule() -> None:
    assert set(TABLE) == set(Phase)
    assert [row.phase for row in ROWS] == list(dict.fromkeys(row.phase for row in ROWS))  # one rule each
    assert {row.phase for row in ROWS} == set(Phase)


@pytest.mark.parametrize("phase", list(Phase), ids=[p.value for p in Phase])
async def test_classify(h: Harness, phase: Phase) -> None:
    TABLE[phase](h)
    assert classify(snapshot(h)) is phase


# ----- every snapshot has exactly one phase


@st.composite
def worlds(draw: st.DrawFn) -> list[Obj]:
    """A requester (or none) and a provider (or none) in any combination of the states the rules read."""
    objs: list[Obj] = []
    if draw(st.booleans()):
        objs.append(node_obj(unschedulable=draw(st.booleans()), deleting=draw(st.booleans())))
    direct = draw(st.booleans())
    requester: Obj | None = None
    if draw(st.booleans()):
        make = direct_requester_obj if direct else requester_obj
        requester = make(
            ip=draw(st.sampled_from([None, "127.0.0.5"])),
            gpus=draw(st.sampled_from([None, ("GPU-0000",)])),
            ready=draw(st.booleans()),
            finalizer=draw(st.booleans()),
            deleting=draw(st.booleans()),
            labels={keys.INSTANCE_LABEL: WANTED} if draw(st.booleans()) else None,
        )
        if draw(st.booleans()):
            requester["metadata"]["annotations"][keys.INFERENCE_SERVER_CONFIG_ANNOTATION] = "isc"
        if requester["metadata"].get("deletionTimestamp") and draw(st.booleans()):
            long_ago(requester)
        objs.append(requester)
    if draw(st.booleans()):
        owner = requester if requester is not None and draw(st.booleans()) else requester_obj(uid="earlier-uid")
        running, ready = draw(st.booleans()), draw(st.booleans())
        if direct:
            pod = provider_obj(bound_to=owner, ready=ready, running=running, deleting=draw(st.booleans()))
        else:
            pod = bound(launcher_obj(ready=ready, running=running, deleting=draw(st.booleans()),
                                     failed=draw(st.booleans())), owner, serving=draw(st.booleans()))  # fmt: skip
        if draw(st.booleans()):
            crash_looping(pod)
        objs.append(pod)
        if draw(st.booleans()) and requester is not None:
            objs.append(bound(launcher_obj("launcher-2"), requester))
    return objs


instances = st.sampled_from([
    None,
    inst(WANTED, sleeping=False),
    inst(WANTED, sleeping=True),
    inst(WANTED, ready=False, sleeping=False),
    inst(WANTED, stopped=True),
])  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(objs=worlds(), state=instances, synced=st.booleans())
async def test_every_snapshot_has_exactly_one_phase(objs: list[Obj], state: InstanceState | None, synced: bool) -> None:
    async with harness() as h:
        h.put(isc_obj(), lc_obj())
        for obj in objs:
            h.put(obj)
        for pod in h.caches.pods.items():
            if pod["metadata"]["name"].startswith("launcher"):
                h.views.put(pod, *([state] if state is not None else []), synced=synced)
        s = observe(NS, REQ, h.caches, h.views, now=time.time())
        holding = [row.phase for row in ROWS if row.holds(s)]
        assert holding, "no rule holds"
        assert classify(s) is holding[0]  # the first of those that hold: exactly one phase


# ----- the drawing


def test_the_architecture_drawing_is_the_classifiers_table() -> None:
    text = ARCHITECTURE.read_text()
    found = re.search(r"<!-- phases:begin -->\n```mermaid\n(.*?)\n```\n<!-- phases:end -->", text, re.DOTALL)
    assert found, "docs/architecture.md has no phase drawing between the phases:begin/end markers"
    assert found.group(1) == mermaid(), "docs/architecture.md's phase drawing is stale: paste mermaid() there"


# ----- the transition recorder (tests/phase_transitions.py)


def test_the_recorder_rejects_an_undeclared_edge() -> None:
    recorder = TransitionRecorder({(Phase.STARTING, Phase.NEEDS_GPUS)})
    recorder.record(REQ, None, Phase.STARTING)
    recorder.record(REQ, Phase.STARTING, Phase.STARTING)  # no change
    recorder.record(REQ, Phase.STARTING, Phase.NEEDS_GPUS)
    with pytest.raises(UndeclaredTransition, match="needs-gpus → serving is not declared"):
        recorder.record(REQ, Phase.NEEDS_GPUS, Phase.SERVING)
    assert recorder.unseen() == []


def test_workers_findings_add_up_in_the_controllers_summary() -> None:
    """Under pytest-xdist (`make test`) each worker records the passes of its own tests; the controller, which
    prints the summary, merges what every worker exported."""
    declared = {(Phase.STARTING, Phase.NEEDS_GPUS), (Phase.NEEDS_GPUS, Phase.UNBOUND)}
    controller, worker_1, worker_2 = (TransitionRecorder(declared) for _ in range(3))
    worker_1.test = "tests/a.py::test_a"
    worker_1.record(REQ, None, Phase.STARTING)
    worker_1.record(REQ, Phase.STARTING, Phase.NEEDS_GPUS)
    worker_2.test = "tests/b.py::test_b"
    worker_2.record(REQ, None, Phase.STARTING)
    controller.merge(worker_1.exported())
    assert controller.unseen() == [(Phase.NEEDS_GPUS, Phase.UNBOUND)]
    controller.merge(worker_2.exported())
    assert controller.passes == 3
    assert controller.seen == {(Phase.STARTING, Phase.NEEDS_GPUS): 1}
    assert controller.tests_by_phase == {
        Phase.STARTING: {"tests/a.py::test_a", "tests/b.py::test_b"},
        Phase.NEEDS_GPUS: {"tests/a.py::test_a"},
    }


async def test_a_drive_across_an_edge_the_table_does_not_declare_fails(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup_needs_gpus(h)
    monkeypatch.setattr(RECORDER, "declared", {edge for edge in RECORDER.declared if edge[0] is not Phase.NEEDS_GPUS})
    with pytest.raises(UndeclaredTransition, match=r"needs-gpus → [a-z-]+ is not declared"):
        await h.drive()


def test_a_declared_edge_changes_the_phase() -> None:
    assert edges() <= {(a, b) for a in Phase for b in Phase if a is not b}
