"""The inference server's phases, and the classifier that names the phase of a snapshot.

`classify` is pure: it reads only the snapshot and returns the first phase of `RULES` whose condition
holds, so every snapshot has exactly one phase and the order of the rules is written down in one place.
Each rule also names the phases that its step's change can lead to; docs/architecture.md draws the
machine from this table (`mermaid()`), and a test fails when the drawing is stale.
"""

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from api import keys
from controller import pods
from controller.dualpods.routing import outdated_routing
from controller.dualpods.snapshot import Mode, Snapshot


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


@dataclass(frozen=True)
class Rule:
    phase: Phase
    when: str  # the condition, in words (for the drawing)
    holds: Callable[[Snapshot], bool]
    leads_to: tuple[Phase, ...]  # what the step's change can bring about


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


RULES: tuple[Rule, ...] = (
    Rule(Phase.GONE, "no requester, no provider", lambda s: s.requester is None and s.provider is None, ()),
    Rule(Phase.CONFLICTED, "several providers are bound", lambda s: bool(s.others), ()),
    Rule(Phase.DISCARDING, "releasing a provider that is lost (node gone, Pod failed, container failing)",
         lambda s: _releasing(s) and s.provider_lost and not _provider_deleting(s), (Phase.PROVIDER_DELETED,)),
    Rule(Phase.UNHOLDING, "requester finalizer without a running provider", lambda s: not s.stale and _holding(s),
         (Phase.PROVIDER_DELETED, Phase.RELEASING, Phase.SETTLING, Phase.LOST)),
    Rule(Phase.PROVIDER_DELETED, "the provider is being deleted", _provider_deleting, (Phase.DEPARTING, Phase.GONE)),
    Rule(Phase.UNROUTING, "releasing a launcher that carries routing labels",
         lambda s: _releasing_launcher(s) and s.routing_on, (Phase.RELEASING, Phase.RELEASE_WAITING)),
    Rule(Phase.RELEASE_WAITING, "releasing a launcher whose instances are not known, within patience",
         lambda s: _releasing_launcher(s) and _waiting_to_release(s), (Phase.RELEASING,)),
    Rule(Phase.RELEASING, "releasing a provider", _releasing, (Phase.GONE, Phase.DEPARTING, Phase.UNBOUND)),
    Rule(Phase.DEPARTING, "the requester is being deleted, nothing bound", lambda s: s.requester_deleting,
         (Phase.GONE,)),
    Rule(Phase.UNSCHEDULED, "no Node, or its Node is being deleted", _node_gone, (Phase.STARTING,)),
    Rule(Phase.STARTING, "no Pod IP yet", lambda s: s.requester is not None and pods.pod_ip(s.requester) is None,
         (Phase.NEEDS_GPUS,)),
    Rule(Phase.INVALID, "both a server patch and an ISC", lambda s: s.mode is Mode.BOTH, ()),
    Rule(Phase.NEEDS_GPUS, "its GPUs are not recorded", lambda s: s.gpus is None,
         (Phase.UNBOUND, Phase.ACQUIRING, Phase.SETTLING)),
    Rule(Phase.CORDONED, "unbound on a cordoned Node", _cordoned, (Phase.DEPARTING,)),
    Rule(Phase.ACQUIRING, "direct mode, unbound", lambda s: s.provider is None and s.mode is Mode.DIRECT,
         (Phase.SETTLING,)),
    Rule(Phase.UNBOUND, "launcher mode, unbound", lambda s: s.provider is None, (Phase.SETTLING,)),
    Rule(Phase.WAKE_FAILED, "its instance failed its post-wake check (and was killed)",
         lambda s: not s.direct_provider and s.wake_check_failed, (Phase.CREATING,)),
    Rule(Phase.LOST, "the instance that served it vanished or stopped",
         lambda s: not s.direct_provider and _lost(s), (Phase.DEPARTING,)),
    Rule(Phase.SETTLING, "its metadata is not in line with the binding", lambda s: s.unsettled,
         (Phase.DIRECT_SERVING, Phase.LAUNCHER_STARTING, Phase.CREATING, Phase.ASLEEP, Phase.SERVING)),
    Rule(Phase.DIRECT_SERVING, "bound to a direct provider", lambda s: s.direct_provider, (Phase.RELEASING,)),
    Rule(Phase.LAUNCHER_STARTING, "the launcher is not reachable", lambda s: not s.reachable,
         (Phase.SETTLING, Phase.CREATING, Phase.LOADING, Phase.ASLEEP, Phase.SERVING, Phase.LOST)),
    Rule(Phase.RECREATING, "the instance stopped before it served", lambda s: s.stopped, (Phase.CREATING,)),
    Rule(Phase.CREATING, "the instance is absent", lambda s: s.instance is None, (Phase.LOADING,)),
    Rule(Phase.LOADING, "the instance is not ready", lambda s: s.instance is not None and not s.instance.ready,
         (Phase.SETTLING, Phase.ASLEEP, Phase.SERVING, Phase.RECREATING)),
    Rule(Phase.ASLEEP, "the instance sleeps", lambda s: s.instance is not None and s.instance.sleeping,
         (Phase.SERVING,)),
    Rule(Phase.MISROUTED, "its routing metadata no longer fits the launcher",
         lambda s: s.provider is not None and bool(outdated_routing(s.provider)), (Phase.DEPARTING,)),
    Rule(Phase.SERVING, "the instance is awake and ready", lambda s: True, (Phase.LOST, Phase.RELEASING)),
)  # fmt: skip

# Phases in which a bound requester must not be Ready: its instance does not serve (yet).
NOT_SERVING = frozenset(
    {Phase.LAUNCHER_STARTING, Phase.WAKE_FAILED, Phase.RECREATING, Phase.CREATING, Phase.LOADING, Phase.ASLEEP}
)


def classify(snapshot: Snapshot) -> Phase:
    """The phase of the inference server: the first rule whose condition holds."""
    return next(rule.phase for rule in RULES if rule.holds(snapshot))


def mermaid() -> str:
    """The state machine as a Mermaid diagram, from RULES."""
    lines = ["stateDiagram-v2"]
    for rule in RULES:
        lines.append(f"    {_node(rule.phase)}: {rule.phase.value} — {rule.when}")
    for rule in RULES:
        for target in rule.leads_to:
            lines.append(f"    {_node(rule.phase)} --> {_node(target)}")
    lines.append(f"    [*] --> {_node(Phase.STARTING)}")
    lines.append(f"    {_node(Phase.GONE)} --> [*]")
    return "\n".join(lines)


def _node(phase: Phase) -> str:
    return phase.name.lower()
