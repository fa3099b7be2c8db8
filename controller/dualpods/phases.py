"""The inference server's phases: one table, one row per phase, the only place a phase is defined.

Each row holds the phase's rule (its condition, in words for the drawing and as code), its one step, whether
its bound instance serves, and the phases its step's change can lead to. `classify` is pure: it reads only
the snapshot and returns the first row whose condition holds. The rows are tried in order, and the order is
part of the rule: a row's condition is read as "this holds, and no earlier row's does" (the drawing numbers
the rows so). Conditions still say what they mean on their own where that is cheap (UNBOUND is "launcher
mode, unbound", SERVING "the instance is awake and ready"), so no snapshot falls through to a catch-all.

Adding a phase is one row here, one step function, and one row in tests/test_dualpods_phases.py's table.
docs/architecture.md draws the machine from this table (`mermaid()`), and a test fails when the drawing is
stale; the transition recorder (tests/phase_transitions.py) fails the unit tests when a pass leads from one
phase to another that its row does not declare.
"""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum

from api import keys
from controller import pods
from controller.dualpods import binding, direct, release, requester_steps, serving
from controller.dualpods.outcomes import Budget, StepResult
from controller.dualpods.passes import Pass
from controller.dualpods.routing import outdated_routing
from controller.dualpods.snapshot import Mode, Snapshot
from controller.launcher_template import LAUNCHER_START_S


class Phase(StrEnum):
    GONE = "gone"  # requester and provider are gone: forget the pair
    PROVIDER_DELETED = "provider-deleted"  # the provider is being deleted: relay it to the requester
    DISCARDING = "discarding"  # a provider to release is really lost: delete it
    UNROUTING = "unrouting"  # a provider to release still carries routing labels: remove them first
    RELEASE_WAITING = "release-waiting"  # a launcher to release is not reachable yet: wait, within patience
    RELEASING = "releasing"  # put the instance away (sleep, or delete) and unbind
    CONFLICTED = "conflicted"  # several providers are bound to the requester
    UNHOLDING = "unholding"  # the requester's finalizer is held without a running provider
    DEPARTING = "departing"  # the requester is being deleted and nothing is bound
    UNSCHEDULED = "unscheduled"  # no Node (not scheduled yet, or its Node is going): Kubernetes acts
    STARTING = "starting"  # no Pod IP yet
    INVALID = "invalid"  # the requester asks for a launcher instance and a direct provider at once
    NEEDS_GPUS = "needs-gpus"  # ask the requester for its GPUs
    CORDONED = "cordoned"  # unbound on a cordoned Node: delete the requester
    ACQUIRING = "acquiring"  # direct mode, unbound: bind a sleeping copy or create a provider
    UNBOUND = "unbound"  # launcher mode, unbound: bind a launcher or create one
    WAKE_FAILED = "wake-failed"  # its instance failed its post-wake check: report it, replace the instance
    LOST = "lost"  # the instance the requester was served by is gone: delete the requester
    SETTLING = "settling"  # bring the requester's metadata in line with its binding
    DIRECT_SERVING = "direct-serving"  # wake the direct provider and relay its readiness
    LAUNCHER_STARTING = "launcher-starting"  # the bound launcher is not reachable (yet)
    RECREATING = "recreating"  # the instance stopped before it served: delete it to start afresh
    CREATING = "creating"  # the instance is absent: make room and create it
    LOADING = "loading"  # the instance is starting
    ASLEEP = "asleep"  # wake the instance (first evicting a sleeper over the GPU budget)
    MISROUTED = "misrouted"  # the binding's routing metadata no longer fits the Pod: delete the requester
    SERVING = "serving"  # the instance serves: endpoint metadata, LoRA adapters, readiness


# A launcher answers once its image is pulled and it has imported vLLM (launcher_template.LAUNCHER_START_S, which
# its startup probe allows too). The controller's --launcher-start-budget (Options.budgets) sets it.
LAUNCHER_START_BUDGET = Budget(seconds=float(LAUNCHER_START_S))
DEFAULT_BUDGET = Budget()

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
    budget: Budget = DEFAULT_BUDGET  # how long a wait or a transient failure stands before the user is told


def _releasing(s: Snapshot) -> bool:
    """The pass is about unbinding its provider: a stale binding, or a requester that is going."""
    return s.provider is not None and (s.stale or s.requester_deleting)


def _releasing_launcher(s: Snapshot) -> bool:
    return _releasing(s) and not s.direct_provider


def _provider_deleting(s: Snapshot) -> bool:
    return s.provider is not None and pods.is_deleting(s.provider)


def _waiting_to_release(s: Snapshot) -> bool:
    """A launcher whose container runs but whose instances are not known: wait, within patience."""
    provider = s.provider
    if provider is None:
        return False
    running = pods.pod_ip(provider) is not None and pods.container_running(provider)
    return running and (s.view is None or not s.view.synced) and not s.patience_over


def _holding(s: Snapshot) -> bool:
    """The requester's finalizer holds it, though no running provider is bound."""
    if s.requester is None:
        return False
    serving = s.provider is not None and pods.container_running(s.provider) and not pods.is_deleting(s.provider)
    return keys.REQUESTER_FINALIZER in pods.finalizers(s.requester) and not serving


def _node_gone(s: Snapshot) -> bool:
    return s.node is None or pods.is_deleting(s.node)


def _cordoned(s: Snapshot) -> bool:
    return s.provider is None and bool(((s.node or {}).get("spec") or {}).get("unschedulable"))


def _lost(s: Snapshot) -> bool:
    vanished = s.reachable and s.instance is None
    return s.served and (vanished or s.stopped)


def _awake_and_ready(s: Snapshot) -> bool:
    return s.instance is not None and s.instance.ready and not s.instance.sleeping


async def _record_gpus_and_bind(p: Pass) -> StepResult:
    """NEEDS_GPUS: ask the requester for its GPUs and, where UNBOUND's row would come next (the rows between
    do not read the GPUs), bind it in the same pass: its GPUs and its binding go in one requester write."""
    result = await requester_steps.record_gpus(p)
    if p.wants.gpus is None or _cordoned(p.s) or not ROW[Phase.UNBOUND].holds(p.s):
        return result
    return await binding.bind(p, p.wants.gpus)


ROWS: tuple[Row, ...] = (
    Row(Phase.GONE, "no requester, no provider", lambda s: s.requester is None and s.provider is None,
        requester_steps.forget, ()),
    Row(Phase.CONFLICTED, "several providers are bound", lambda s: bool(s.others), requester_steps.conflicted, ()),
    Row(Phase.DISCARDING, "releasing a provider that is lost (node gone, Pod failed, container failing)",
        lambda s: _releasing(s) and s.provider_lost and not _provider_deleting(s), release.discard,
        (Phase.PROVIDER_DELETED,)),
    Row(Phase.UNHOLDING, "requester finalizer without a running provider", lambda s: not s.stale and _holding(s),
        requester_steps.unhold, (Phase.PROVIDER_DELETED, Phase.RELEASING, Phase.SETTLING, Phase.LOST)),
    Row(Phase.PROVIDER_DELETED, "the provider is being deleted", _provider_deleting, release.relay_deletion,
        (Phase.DEPARTING, Phase.GONE)),
    Row(Phase.UNROUTING, "releasing a launcher that carries routing labels",
        lambda s: _releasing_launcher(s) and s.routing_on, release.unroute,
        (Phase.RELEASING, Phase.RELEASE_WAITING)),
    Row(Phase.RELEASE_WAITING, "releasing a launcher whose instances are not known, within patience",
        lambda s: _releasing_launcher(s) and _waiting_to_release(s), release.wait_for_launcher, (Phase.RELEASING,)),
    Row(Phase.RELEASING, "releasing a provider", _releasing, release.release,
        (Phase.GONE, Phase.DEPARTING, Phase.UNBOUND)),
    Row(Phase.DEPARTING, "the requester is being deleted, nothing bound",
        lambda s: s.requester_deleting and s.provider is None, requester_steps.nothing, (Phase.GONE,)),
    Row(Phase.UNSCHEDULED, "no Node, or its Node is being deleted", _node_gone, requester_steps.nothing,
        (Phase.STARTING,)),
    Row(Phase.STARTING, "no Pod IP yet", lambda s: s.requester is not None and pods.pod_ip(s.requester) is None,
        requester_steps.nothing, (Phase.NEEDS_GPUS,)),
    Row(Phase.INVALID, "both a server patch and an ISC", lambda s: s.mode is Mode.BOTH, requester_steps.invalid, ()),
    Row(Phase.NEEDS_GPUS, "its GPUs are not recorded", lambda s: s.gpus is None, _record_gpus_and_bind,
        (Phase.UNBOUND, Phase.ACQUIRING, Phase.SETTLING, Phase.LAUNCHER_STARTING, Phase.CREATING,
         Phase.LOADING, Phase.ASLEEP, Phase.SERVING)),
    Row(Phase.CORDONED, "unbound on a cordoned Node", _cordoned, requester_steps.cordoned, (Phase.DEPARTING,)),
    Row(Phase.ACQUIRING, "direct mode, unbound", lambda s: s.provider is None and s.mode is Mode.DIRECT,
        direct.acquire, (Phase.SETTLING,)),
    Row(Phase.UNBOUND, "launcher mode, unbound", lambda s: s.provider is None and s.mode is Mode.LAUNCHER,
        binding.bind,
        (Phase.SETTLING, Phase.LAUNCHER_STARTING, Phase.CREATING, Phase.LOADING, Phase.ASLEEP, Phase.SERVING)),
    Row(Phase.WAKE_FAILED, "its instance failed its post-wake check (and was killed)",
        lambda s: not s.direct_provider and s.wake_check_failed, serving.replace_failed_wake, (Phase.CREATING,),
        serves=False),
    Row(Phase.LOST, "the instance that served it vanished or stopped",
        lambda s: not s.direct_provider and _lost(s), requester_steps.lost, (Phase.DEPARTING,)),
    Row(Phase.SETTLING, "its metadata is not in line with the binding", lambda s: s.unsettled, requester_steps.settle,
        (Phase.DIRECT_SERVING, Phase.LAUNCHER_STARTING, Phase.RECREATING, Phase.CREATING, Phase.LOADING, Phase.ASLEEP,
         Phase.SERVING)),
    Row(Phase.DIRECT_SERVING, "bound to a direct provider", lambda s: s.direct_provider, direct.actuate,
        (Phase.RELEASING,), serves=True),
    Row(Phase.LAUNCHER_STARTING, "the launcher is not reachable", lambda s: not s.reachable, serving.await_launcher,
        (Phase.SETTLING, Phase.CREATING, Phase.LOADING, Phase.ASLEEP, Phase.SERVING, Phase.LOST), serves=False,
        budget=LAUNCHER_START_BUDGET),
    Row(Phase.RECREATING, "the instance stopped before it served", lambda s: s.stopped and not s.served,
        serving.recreate, (Phase.CREATING,), serves=False),
    Row(Phase.CREATING, "the instance is absent", lambda s: s.reachable and s.instance is None, serving.create,
        (Phase.SETTLING, Phase.LOADING), serves=False),
    Row(Phase.LOADING, "the instance is not ready", lambda s: s.instance is not None and not s.instance.ready,
        requester_steps.nothing, (Phase.SETTLING, Phase.ASLEEP, Phase.SERVING, Phase.RECREATING), serves=False),
    Row(Phase.ASLEEP, "the instance sleeps", lambda s: s.instance is not None and s.instance.sleeping, serving.wake,
        (Phase.WAKE_FAILED, Phase.SERVING), serves=False),
    Row(Phase.MISROUTED, "its routing metadata no longer fits the launcher",
        lambda s: s.provider is not None and bool(outdated_routing(s.provider)), serving.misrouted,
        (Phase.DEPARTING,)),
    Row(Phase.SERVING, "the instance is awake and ready", _awake_and_ready, serving.serve,
        (Phase.LOST, Phase.RELEASING), serves=True),
)  # fmt: skip

ROW = {row.phase: row for row in ROWS}


def classify(snapshot: Snapshot) -> Phase:
    """The phase of the inference server: the first row whose condition holds."""
    return next(row.phase for row in ROWS if row.holds(snapshot))


def edges() -> set[tuple[Phase, Phase]]:
    """Every phase change the table declares (a step's change leading to another phase)."""
    return {(row.phase, target) for row in ROWS for target in row.leads_to}


def mermaid() -> str:
    """The state machine as a Mermaid diagram, from ROWS: each phase with its row number (the rows are
    tried in that order) and its condition."""
    lines = ["stateDiagram-v2"]
    for number, row in enumerate(ROWS, start=1):
        lines.append(f"    {_node(row.phase)}: {number}. {row.phase.value} — {row.when}")
    for row in ROWS:
        for target in row.leads_to:
            lines.append(f"    {_node(row.phase)} --> {_node(target)}")
    lines.append(f"    [*] --> {_node(Phase.STARTING)}")
    lines.append(f"    {_node(Phase.GONE)} --> [*]")
    return "\n".join(lines)


def _node(phase: Phase) -> str:
    return phase.name.lower()
