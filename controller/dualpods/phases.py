"""The inference server's phases: one table, one row per phase, the only place a phase is defined.

Each row holds the phase's rule (its condition, in words for the drawing and as code), its one step, whether
its bound instance serves, and the phases its step's change can lead to. Every rule reads alone: it holds in
its own situation and in no other row's, so the order of the rows says nothing (it is the Phase enum's order,
and the drawing's). `classify` is pure: it reads only the snapshot, evaluates every rule and returns the one
that holds; tests/test_dualpods_phases.py checks, on generated snapshots, that exactly one does.

The rules are made of a few situations (below), each written once: a stale or departing binding is released,
a requester held by its finalizer is let go, a requester that stays is admitted (scheduled, started, valid,
its GPUs recorded) and then either bound or served through its binding.

Adding a phase is one row here, one step function, and one row in tests/test_dualpods_phases.py's table.
docs/architecture.md draws the machine from this table (`python -m scripts.phase_diagram` writes it, and a
test fails when it is stale); the transition recorder (tests/phase_transitions.py) fails the unit tests when
a pass leads from one phase to another that its row does not declare.
"""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum

from api import keys
from controller import pods
from controller.dualpods import binding, direct, release, requester_steps, serving
from controller.dualpods.outcomes import StepResult, TimeBudget
from controller.dualpods.passes import Pass
from controller.dualpods.routing import outdated_routing
from controller.dualpods.snapshot import Mode, Snapshot
from controller.launcher_template import LAUNCHER_START_S


class Phase(StrEnum):
    """A phase of an inference server, in the order of ROWS; what each means is its row's `when`."""

    GONE = "gone"
    CONFLICTED = "conflicted"
    DISCARDING = "discarding"
    UNHOLDING = "unholding"
    PROVIDER_DELETED = "provider-deleted"
    UNROUTING = "unrouting"
    RELEASE_WAITING = "release-waiting"
    RELEASING = "releasing"
    DEPARTING = "departing"
    UNSCHEDULED = "unscheduled"
    STARTING = "starting"
    INVALID = "invalid"
    NEEDS_GPUS = "needs-gpus"
    CORDONED = "cordoned"
    ACQUIRING = "acquiring"
    UNBOUND = "unbound"
    WAKE_FAILED = "wake-failed"
    LOST = "lost"
    SETTLING = "settling"
    DIRECT_SERVING = "direct-serving"
    LAUNCHER_STARTING = "launcher-starting"
    RECREATING = "recreating"
    CREATING = "creating"
    LOADING = "loading"
    ASLEEP = "asleep"
    MISROUTED = "misrouted"
    SERVING = "serving"


# A launcher answers once its image is pulled and it has imported vLLM (launcher_template.LAUNCHER_START_S, which
# its startup probe allows too). The controller's --launcher-start-budget sets it (the Reconciler's `budgets`).
LAUNCHER_START_BUDGET = TimeBudget(seconds=float(LAUNCHER_START_S))
DEFAULT_BUDGET = TimeBudget()

Step = Callable[[Pass], Awaitable[StepResult]]


@dataclass(frozen=True)
class Row:
    """One phase: when it holds, what its step does, and where that can lead."""

    phase: Phase
    when: str  # the condition, in words (for the drawing)
    holds: Callable[[Snapshot], bool]
    step: Step
    leads_to: tuple[Phase, ...]  # the phases the step's change can bring about
    # Whether a bound instance serves in this phase: False, it does not (yet), so the requester is told it is
    # not Ready after the step; True, the step relays readiness itself; None, no bound instance to speak of.
    serves: bool | None = None
    budget: TimeBudget = DEFAULT_BUDGET  # how long a wait or a transient failure stands before the user is told


# ----- the situations: a binding to release, a finalizer to let go, a requester that stays


def _provider_deleting(s: Snapshot) -> bool:
    return s.provider is not None and pods.is_deleting(s.provider)


def _holding(s: Snapshot) -> bool:
    """The requester's finalizer holds it, though no running provider is bound."""
    if s.requester is None:
        return False
    serving = s.provider is not None and pods.container_running(s.provider) and not pods.is_deleting(s.provider)
    return keys.REQUESTER_FINALIZER in pods.finalizers(s.requester) and not serving


def _releasing(s: Snapshot) -> bool:
    """The pass is about unbinding its provider: a stale binding, or a requester that is going (a requester
    bound to several providers is a conflict instead)."""
    return s.provider is not None and not s.others and (s.stale or s.requester_deleting)


def _discarding(s: Snapshot) -> bool:
    return _releasing(s) and s.provider_lost and not _provider_deleting(s)


def _unholding(s: Snapshot) -> bool:
    """The requester's own finalizer is to go (a lost provider to release is discarded first)."""
    return not s.stale and not s.others and _holding(s) and not _discarding(s)


def _unbinding(s: Snapshot) -> bool:
    """A release that goes ahead: its provider is neither lost nor being deleted, and no finalizer is to go."""
    return _releasing(s) and not s.provider_lost and not _provider_deleting(s) and not _unholding(s)


def _waiting_to_release(s: Snapshot) -> bool:
    """A launcher whose container runs but whose instances are not known: wait, within patience."""
    provider = s.provider
    if provider is None:
        return False
    running = pods.pod_ip(provider) is not None and pods.container_running(provider)
    return running and (s.view is None or not s.view.synced) and not s.patience_over


def _staying(s: Snapshot) -> bool:
    """The requester stays, and its binding, if any, is its own and stands: nothing to release or let go."""
    return (
        s.requester is not None
        and not s.requester_deleting
        and not s.stale
        and not s.others
        and not _holding(s)
        and not _provider_deleting(s)
    )


def _node_gone(s: Snapshot) -> bool:
    return s.node is None or pods.is_deleting(s.node)


def _scheduled(s: Snapshot) -> bool:
    return _staying(s) and not _node_gone(s)


def _started(s: Snapshot) -> bool:
    return _scheduled(s) and s.requester is not None and pods.pod_ip(s.requester) is not None


def _valid(s: Snapshot) -> bool:
    return _started(s) and s.mode is not Mode.BOTH


def _admitted(s: Snapshot) -> bool:
    """A staying requester ready to be bound or served: scheduled, started, valid, its GPUs recorded."""
    return _valid(s) and s.gpus is not None


def _bound(s: Snapshot) -> bool:
    return _admitted(s) and s.provider is not None


def _lost(s: Snapshot) -> bool:
    vanished = s.reachable and s.instance is None
    return s.served and (vanished or s.stopped)


def _broken(s: Snapshot) -> bool:
    """The bound launcher's instance failed its post-wake check, or the instance that served is gone."""
    return not s.direct_provider and (s.wake_check_failed or _lost(s))


def _in_line(s: Snapshot) -> bool:
    """Bound, whole, and the requester's metadata in line with the binding: the binding is to serve."""
    return _bound(s) and not _broken(s) and not s.unsettled


def _launcher_up(s: Snapshot) -> bool:
    return _in_line(s) and not s.direct_provider and s.reachable


def _instance_runs(s: Snapshot) -> bool:
    return _launcher_up(s) and s.instance is not None and not s.stopped


def _awake_and_ready(s: Snapshot) -> bool:
    return _instance_runs(s) and s.instance is not None and s.instance.ready and not s.instance.sleeping


def _misrouted(s: Snapshot) -> bool:
    return s.provider is not None and bool(outdated_routing(s.provider))


ROWS: tuple[Row, ...] = (
    Row(Phase.GONE, "no requester, no provider", lambda s: s.requester is None and s.provider is None,
        requester_steps.forget, ()),
    Row(Phase.CONFLICTED, "several providers are bound", lambda s: bool(s.others), requester_steps.conflicted, ()),
    Row(Phase.DISCARDING, "releasing a provider that is lost (node gone, Pod failed, container failing)",
        _discarding, release.discard, (Phase.PROVIDER_DELETED, Phase.UNHOLDING)),
    Row(Phase.UNHOLDING, "requester finalizer without a running provider", _unholding, requester_steps.unhold,
        (Phase.PROVIDER_DELETED, Phase.RELEASING, Phase.SETTLING, Phase.LOST, Phase.UNBOUND)),
    Row(Phase.PROVIDER_DELETED, "the provider is being deleted",
        lambda s: _provider_deleting(s) and not s.others and not _unholding(s), release.relay_deletion,
        (Phase.DEPARTING, Phase.GONE)),
    Row(Phase.UNROUTING, "releasing a launcher that carries routing labels",
        lambda s: _unbinding(s) and not s.direct_provider and s.routing_on, release.unroute,
        (Phase.RELEASING, Phase.RELEASE_WAITING)),
    Row(Phase.RELEASE_WAITING, "releasing a launcher whose instances are not known, within patience",
        lambda s: _unbinding(s) and not s.direct_provider and not s.routing_on and _waiting_to_release(s),
        release.wait_for_launcher, (Phase.RELEASING,)),
    Row(Phase.RELEASING, "releasing a direct provider, or an unrouted launcher whose instances are known (or "
        "patience ran out)",
        lambda s: _unbinding(s) and (s.direct_provider or not (s.routing_on or _waiting_to_release(s))),
        release.release, (Phase.GONE, Phase.DEPARTING, Phase.UNBOUND, Phase.PROVIDER_DELETED)),
    Row(Phase.DEPARTING, "the requester is being deleted, nothing bound, no finalizer",
        lambda s: s.requester_deleting and s.provider is None and not _holding(s), requester_steps.nothing,
        (Phase.GONE,)),
    Row(Phase.UNSCHEDULED, "staying, no Node or its Node is being deleted", lambda s: _staying(s) and _node_gone(s),
        requester_steps.nothing, (Phase.STARTING,)),
    Row(Phase.STARTING, "staying, scheduled, no Pod IP yet", lambda s: _scheduled(s) and not _started(s),
        requester_steps.nothing, (Phase.NEEDS_GPUS,)),
    Row(Phase.INVALID, "started, both a server patch and an ISC", lambda s: _started(s) and s.mode is Mode.BOTH,
        requester_steps.invalid, ()),
    Row(Phase.NEEDS_GPUS, "started and valid, its GPUs not recorded", lambda s: _valid(s) and s.gpus is None,
        requester_steps.record_gpus_and_bind,
        (Phase.UNBOUND, Phase.ACQUIRING, Phase.SETTLING, Phase.LAUNCHER_STARTING, Phase.CREATING,
         Phase.LOADING, Phase.ASLEEP, Phase.SERVING)),
    Row(Phase.CORDONED, "admitted, unbound on a cordoned Node",
        lambda s: _admitted(s) and s.provider is None and s.cordoned, requester_steps.cordoned,
        (Phase.DEPARTING, Phase.GONE)),
    Row(Phase.ACQUIRING, "admitted, direct mode, to bind",
        lambda s: _admitted(s) and s.bindable and s.mode is Mode.DIRECT, direct.acquire, (Phase.SETTLING,)),
    Row(Phase.UNBOUND, "admitted, launcher mode, to bind",
        lambda s: _admitted(s) and s.bindable and s.mode is Mode.LAUNCHER, binding.bind,
        (Phase.SETTLING, Phase.LAUNCHER_STARTING, Phase.CREATING, Phase.LOADING, Phase.ASLEEP, Phase.SERVING)),
    Row(Phase.WAKE_FAILED, "its instance failed its post-wake check (and was killed)",
        lambda s: _bound(s) and not s.direct_provider and s.wake_check_failed, serving.replace_failed_wake,
        (Phase.CREATING,), serves=False),
    Row(Phase.LOST, "the instance that served it vanished or stopped",
        lambda s: _bound(s) and _broken(s) and not s.wake_check_failed, requester_steps.lost,
        (Phase.DEPARTING, Phase.UNROUTING, Phase.RELEASING)),
    Row(Phase.SETTLING, "bound, its metadata not in line with the binding",
        lambda s: _bound(s) and not _broken(s) and s.unsettled, requester_steps.settle,
        (Phase.DIRECT_SERVING, Phase.LAUNCHER_STARTING, Phase.RECREATING, Phase.CREATING, Phase.LOADING, Phase.ASLEEP,
         Phase.SERVING)),
    Row(Phase.DIRECT_SERVING, "bound to a direct provider, in line", lambda s: _in_line(s) and s.direct_provider,
        direct.actuate, (Phase.RELEASING,), serves=True),
    Row(Phase.LAUNCHER_STARTING, "bound to a launcher that is not reachable",
        lambda s: _in_line(s) and not s.direct_provider and not s.reachable, serving.await_launcher,
        (Phase.SETTLING, Phase.CREATING, Phase.LOADING, Phase.ASLEEP, Phase.SERVING, Phase.LOST), serves=False,
        budget=LAUNCHER_START_BUDGET),
    Row(Phase.RECREATING, "the instance stopped before it served",
        lambda s: _launcher_up(s) and s.stopped and not s.served, serving.recreate, (Phase.CREATING,), serves=False),
    Row(Phase.CREATING, "the instance is absent", lambda s: _launcher_up(s) and s.instance is None, serving.create,
        (Phase.SETTLING, Phase.LOADING), serves=False),
    Row(Phase.LOADING, "the instance runs, not ready",
        lambda s: _instance_runs(s) and s.instance is not None and not s.instance.ready, requester_steps.nothing,
        (Phase.SETTLING, Phase.ASLEEP, Phase.SERVING, Phase.RECREATING), serves=False),
    Row(Phase.ASLEEP, "the instance is ready and sleeps",
        lambda s: _instance_runs(s) and s.instance is not None and s.instance.ready and s.instance.sleeping,
        serving.wake, (Phase.WAKE_FAILED, Phase.SERVING), serves=False),
    Row(Phase.MISROUTED, "awake and ready, its routing metadata no longer fits the launcher",
        lambda s: _awake_and_ready(s) and _misrouted(s), serving.misrouted, (Phase.DEPARTING, Phase.RELEASING)),
    Row(Phase.SERVING, "awake and ready, its routing metadata fits",
        lambda s: _awake_and_ready(s) and not _misrouted(s), serving.serve, (Phase.LOST, Phase.RELEASING),
        serves=True),
)  # fmt: skip

ROW = {row.phase: row for row in ROWS}


class Unclassified(RuntimeError):
    """No rule, or more than one, holds for a snapshot: a defect of the table (a bug, not a problem to report)."""


def holding(snapshot: Snapshot) -> list[Phase]:
    """The phases whose rule holds for `snapshot`: every rule is evaluated, and exactly one should."""
    return [row.phase for row in ROWS if row.holds(snapshot)]


def classify(snapshot: Snapshot) -> Phase:
    """The phase of the inference server: the one row whose condition holds."""
    found = holding(snapshot)
    if len(found) != 1:
        named = ", ".join(phase.value for phase in found) or "no phase"
        raise Unclassified(f"{snapshot.namespace}/{snapshot.name}: the rules of {named} hold")
    return found[0]


def edges() -> set[tuple[Phase, Phase]]:
    """Every phase change the table declares (a step's change leading to another phase)."""
    return {(row.phase, target) for row in ROWS for target in row.leads_to}


def mermaid() -> str:
    """The state machine as a Mermaid diagram, from ROWS: each phase with its condition, and its arrows."""
    lines = ["stateDiagram-v2"]
    lines += [f"    {_node(row.phase)}: {row.phase.value} — {row.when}" for row in ROWS]
    lines += [f"    {_node(row.phase)} --> {_node(target)}" for row in ROWS for target in row.leads_to]
    lines.append(f"    [*] --> {_node(Phase.STARTING)}")
    lines.append(f"    {_node(Phase.GONE)} --> [*]")
    return "\n".join(lines)


def _node(phase: Phase) -> str:
    return phase.name.lower()
