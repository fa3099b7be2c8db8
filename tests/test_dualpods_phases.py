"""The classifier of the inference server's phases (controller/dualpods/phases.py): one table row per phase,
a property test that every snapshot has exactly one phase, and the drawing in docs/architecture.md.

Snapshots are observed, as a pass observes them, from the controller's caches loaded by hand and the fake
launcher views (tests/test_dualpods_fakes.py).
"""

import dataclasses
import re
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes_asyncio import client

from api import keys
from api.launcher import InstanceState
from controller.dualpods import phases
from controller.dualpods.passes import Options
from controller.dualpods.phases import ROW, ROWS, Phase, Unclassified, classify, edges, mermaid
from controller.dualpods.snapshot import UNBIND_PATIENCE_S, Snapshot, observe
from kube.informer import Obj
from scripts import phase_diagram
from tests.phase_transitions import RECORDER, TransitionRecorder, UndeclaredTransition
from tests.test_dualpods_fakes import (
    LAUNCHER,
    NS,
    PROVIDER,
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


def test_the_table_is_the_enum_in_order_and_every_phase_has_a_rule() -> None:
    assert list(TABLE) == list(Phase)
    assert [row.phase for row in ROWS] == list(Phase)  # one rule each, in the enum's order


@pytest.mark.parametrize("phase", list(Phase), ids=[p.value for p in Phase])
async def test_classify(h: Harness, phase: Phase) -> None:
    TABLE[phase](h)
    assert classify(snapshot(h)) is phase


# ----- every snapshot has exactly one phase: every rule evaluated, whatever the order of the rows


instances = st.sampled_from([
    None,
    inst(WANTED, sleeping=False),
    inst(WANTED, sleeping=True),
    inst(WANTED, ready=False, sleeping=False),
    inst(WANTED, ready=False, sleeping=True),
    inst(WANTED, stopped=True),
    inst(WANTED, stopped=True, ready=False, sleeping=False),
    inst(WANTED, wake_check_failed=True),
])  # fmt: skip


# What can be off in a world where a requester is served: the rules read each of these.
OFF = (
    "no node", "node cordoned", "node deleting",
    "no requester", "requester without ip", "requester without gpus", "requester deleting", "requester long gone",
    "requester of both modes", "requester unsettled", "requester not served", "requester ready",
    "no provider", "provider of an earlier requester", "provider not running", "provider not ready",
    "provider deleting", "provider failed", "provider crash-looping", "provider misrouted", "provider not serving",
    "second provider", "views not synced",
)  # fmt: skip


@st.composite
def worlds(draw: st.DrawFn) -> tuple[list[Obj], InstanceState | None, bool]:
    """A world where a requester is served, with up to three things off (so every phase is drawn, and where two
    rules could meet); the instance its launcher reports, and whether the launcher views are synced."""
    off = draw(st.sets(st.sampled_from(OFF), max_size=3))
    direct = draw(st.booleans())
    objs: list[Obj] = []
    if "no node" not in off:
        objs.append(node_obj(unschedulable="node cordoned" in off, deleting="node deleting" in off))
    requester = (direct_requester_obj if direct else requester_obj)(
        ip=None if "requester without ip" in off else "127.0.0.5",
        gpus=None if "requester without gpus" in off else ("GPU-0000",),
        ready="requester ready" in off,
        deleting="requester deleting" in off or "requester long gone" in off,
    )
    if "requester long gone" in off:
        long_ago(requester)
    if "requester of both modes" in off:
        requester["metadata"]["annotations"][keys.INFERENCE_SERVER_CONFIG_ANNOTATION] = "isc"
    if "requester unsettled" not in off:
        settled(requester, launcher=PROVIDER if direct else LAUNCHER)
    if "requester not served" in off:
        requester["metadata"]["labels"].pop(keys.INSTANCE_LABEL, None)
    if "no requester" not in off:
        objs.append(requester)
    owner = requester_obj(uid="earlier-uid") if "provider of an earlier requester" in off else requester
    running, ready, deleting = (
        "provider not running" not in off,
        "provider not ready" not in off,
        "provider deleting" in off,
    )
    if direct:
        pod = provider_obj(bound_to=owner, ready=ready, running=running, deleting=deleting, sleeping="false")
    else:
        routing = '{"labels": {"kubernetes.io/pool": "a"}}' if "provider misrouted" in off else None
        pod = bound(launcher_obj(ready=ready, running=running, deleting=deleting, failed="provider failed" in off),
                    owner, serving="provider not serving" not in off, routing_json=routing)  # fmt: skip
    if "provider crash-looping" in off:
        crash_looping(pod)
    if "no provider" not in off:
        objs.append(pod)
    if "second provider" in off:
        objs.append(bound(launcher_obj("launcher-2"), requester))
    return objs, draw(instances), "views not synced" not in off


@pytest.fixture
async def api() -> AsyncIterator[client.ApiClient]:
    """One API client for every example of a property test (making one loads the TLS trust store): it only binds
    the informers, and never connects."""
    async with client.ApiClient() as made:
        yield made


def world_snapshot(api: client.ApiClient, objs: list[Obj], state: InstanceState | None, synced: bool) -> Snapshot:
    """The snapshot of REQ in a world of `objs`, each launcher reporting `state` (synced or not)."""
    h = Harness(api, Options())
    h.put(isc_obj(), lc_obj())
    for obj in objs:
        h.put(obj)
    for pod in h.caches.pods.items():
        if pod["metadata"]["name"].startswith("launcher"):
            h.views.put(pod, *([state] if state is not None else []), synced=synced)
    return observe(NS, REQ, h.caches, h.views, now=time.time())


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(world=worlds())
def test_every_snapshot_has_exactly_one_phase(
    api: client.ApiClient, world: tuple[list[Obj], InstanceState | None, bool]
) -> None:
    s = world_snapshot(api, *world)
    holding = [row.phase for row in ROWS if row.holds(s)]
    assert len(holding) == 1, f"the rules of {[phase.value for phase in holding]} hold at once"
    assert classify(s) is holding[0]


async def test_where_two_rules_hold_classify_names_them_rather_than_pick_one(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Order decides nothing: a table whose rules overlap is a defect that classify reports."""
    overlapping = dataclasses.replace(ROW[Phase.SERVING], holds=lambda s: True)
    monkeypatch.setattr(phases, "ROWS", (*ROWS, overlapping))
    with pytest.raises(Unclassified, match="the rules of gone, serving hold"):
        classify(snapshot(h))


# ----- the drawing


def test_the_architecture_drawing_is_the_classifiers_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert phase_diagram.main(["--check"]) == 0, capsys.readouterr().err


def test_the_drawing_is_written_between_its_markers_only() -> None:
    text = "intro\n<!-- phases:begin -->\n```mermaid\nold\n```\n<!-- phases:end -->\nrest\n"
    assert phase_diagram.render(text) == text.replace("old", mermaid())
    with pytest.raises(ValueError, match="not 0"):
        phase_diagram.render("no markers")


# ----- the step tests, grouped by phase

STEP_TEST_MODULES = ("test_dualpods_reconcile.py", "test_dualpods_direct.py")
_HEADER = re.compile(r"^# ----- (.*)$")
_PHASE_HEADER = re.compile(r"^([A-Z][A-Z_]*): (.*)$")  # an upper-case name: a phase's section
_TEST = re.compile(r"^(?:async )?def (test_\w+)")


def grouping_problems(modules: dict[str, str]) -> list[str]:
    """What is wrong with how `modules` (name -> source) group their step tests: each phase's tests under a
    `# ----- NAME: <its row's condition>` header, NAME a phase of the table, its sections in the table's order,
    none empty, and every phase with a section in one of the modules."""
    problems: list[str] = []
    covered: set[Phase] = set()
    for module, text in modules.items():
        sections: list[tuple[Phase, int, list[str]]] = []
        tests: list[str] | None = None  # those of the phase section being read; None outside one
        for number, line in enumerate(text.splitlines(), 1):
            header = _HEADER.match(line)
            if header is not None:
                tests = None
                found = _PHASE_HEADER.match(header.group(1))
                if found is None:
                    continue
                name, when = found.groups()
                if name not in Phase.__members__:
                    problems.append(f"{module}:{number}: {name} is no phase of the table (ROWS in phases.py)")
                    continue
                phase = Phase[name]
                if not ROW[phase].when.startswith(when):
                    problems.append(f"{module}:{number}: {name} says {when!r}, its row {ROW[phase].when!r}")
                tests = []
                sections.append((phase, number, tests))
            elif tests is not None and (test := _TEST.match(line)) is not None:
                tests.append(test.group(1))
        order = [phase for phase, _, _ in sections]
        if order != sorted(order, key=list(Phase).index) or len(set(order)) != len(order):
            problems.append(f"{module}: its phase sections are not once each in the table's order: "
                            f"{', '.join(phase.name for phase in order)}")  # fmt: skip
        problems += [f"{module}:{number}: {phase.name} has no step test" for phase, number, tests in sections
                     if not tests]  # fmt: skip
        covered.update(order)
    missing = [phase.name for phase in Phase if phase not in covered]
    if missing:
        problems.append(f"no step tests for {', '.join(missing)}: each needs a `# ----- NAME: <its condition>` "
                        f"section in {' or '.join(modules)}")  # fmt: skip
    return problems


def test_every_phase_has_its_step_tests_under_its_name_in_the_tables_order() -> None:
    here = Path(__file__).parent
    assert grouping_problems({name: (here / name).read_text() for name in STEP_TEST_MODULES}) == []


def test_a_misnamed_misplaced_empty_or_missing_phase_section_is_a_problem() -> None:
    text = """
# ----- SERVING: awake and ready, its routing metadata fits
def test_a() -> None: ...
# ----- GONE: no requester
async def test_b() -> None: ...
# ----- RELEASNG: releasing a direct provider
def test_c() -> None: ...
# ----- LOST: the instance stopped
# ----- whole actuations
def test_d() -> None: ...
"""
    problems = grouping_problems({"m.py": text})
    assert problems[:4] == [
        "m.py:6: RELEASNG is no phase of the table (ROWS in phases.py)",
        "m.py:8: LOST says 'the instance stopped', its row 'the instance that served it vanished or stopped'",
        "m.py: its phase sections are not once each in the table's order: SERVING, GONE, LOST",
        "m.py:8: LOST has no step test",
    ]
    missing = ", ".join(phase.name for phase in Phase if phase not in (Phase.GONE, Phase.LOST, Phase.SERVING))
    assert problems[4:] == [
        f"no step tests for {missing}: each needs a `# ----- NAME: <its condition>` section in m.py"
    ]


# ----- the transition recorder (tests/phase_transitions.py)


def test_the_recorder_rejects_an_undeclared_edge() -> None:
    recorder = TransitionRecorder({(Phase.STARTING, Phase.NEEDS_GPUS)})
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
    worker_1.record(REQ, Phase.STARTING, Phase.NEEDS_GPUS)
    worker_1.record(REQ, Phase.NEEDS_GPUS, Phase.NEEDS_GPUS)
    worker_2.test = "tests/b.py::test_b"
    worker_2.record(REQ, Phase.STARTING, Phase.STARTING)
    controller.merge(worker_1.exported())
    assert controller.unseen() == [(Phase.NEEDS_GPUS, Phase.UNBOUND)]
    controller.merge(worker_2.exported())
    assert controller.passes == 3
    assert controller.seen == {(Phase.STARTING, Phase.NEEDS_GPUS): 1}
    assert controller.tests_by_phase == {
        Phase.STARTING: {"tests/a.py::test_a", "tests/b.py::test_b"},
        Phase.NEEDS_GPUS: {"tests/a.py::test_a"},
    }


async def test_a_pass_across_an_edge_the_table_does_not_declare_fails_its_test(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A single pass is recorded as a drive's are: removing a declared edge that a test crosses fails it."""
    setup_needs_gpus(h)
    monkeypatch.setattr(RECORDER, "declared", RECORDER.declared - {(Phase.NEEDS_GPUS, Phase.SETTLING)})
    with pytest.raises(UndeclaredTransition, match="needs-gpus → settling is not declared"):
        await h.reconcile()
    assert h.phase() is Phase.SETTLING  # the pass did change the phase: the recorder saw it after the pass


async def test_a_drive_across_an_edge_the_table_does_not_declare_fails(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup_needs_gpus(h)
    monkeypatch.setattr(RECORDER, "declared", {edge for edge in RECORDER.declared if edge[0] is not Phase.NEEDS_GPUS})
    with pytest.raises(UndeclaredTransition, match=r"needs-gpus → [a-z-]+ is not declared"):
        await h.drive()


def test_a_declared_edge_changes_the_phase() -> None:
    assert edges() <= {(a, b) for a in Phase for b in Phase if a is not b}
