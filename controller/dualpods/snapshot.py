"""One inference server as a reconcile pass sees it: everything read once, at the start of the pass.

`observe` takes what the informer caches and the launcher views hold about one requester name — the
requester, the provider the pass is about, their Nodes, the bound launcher's reported instances, the
InferenceServerConfig and LauncherConfigs, each parsed once — and freezes it. The classifier
(phases.py) and the steps read only the snapshot, so a pass decides on one consistent picture even while
the caches change under it. The Pods are the caches' own objects: nothing may mutate them (writes go
through copies, see writer.py).
"""

import copy
import time
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Any, Generic, TypeVar

from pydantic import ValidationError

from api import keys
from api.crds import CustomResource, InferenceServerConfig, LauncherConfig
from api.launcher import InstanceState, InstanceStatus, StopReason
from controller import pods
from controller.dualpods.routing import committed_routing
from controller.dualpods.writer import set_annotation, set_finalizer, set_label
from controller.launcher_views import LauncherView, ViewSource
from kube.informer import Informer, Obj

T = TypeVar("T")
C = TypeVar("C", bound=CustomResource)

BOUND_TO = "bound-to"  # pod index: requester name -> the providers whose binding names it
# How long past a requester's deletion its finalizer waits for an unreachable launcher before the
# provider is unbound without putting its instance away (it is then tidied when it is reachable again).
UNBIND_PATIENCE_S = 20.0


class Mode(StrEnum):
    """What a requester asks for: an instance in a launcher (its ISC annotation) or a direct provider
    (its server patch); both at once is a user error."""

    LAUNCHER = "launcher"
    DIRECT = "direct"
    BOTH = "both"


class Absence(StrEnum):
    """Why a referenced object has no parsed value."""

    MISSING = "missing"  # no object of that name
    INVALID = "invalid"  # it exists, but does not parse


@dataclass(frozen=True)
class Unparsed:
    """A referenced object that is missing or invalid, and the message a user reads about it."""

    absence: Absence
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Parsed(Generic[T]):
    """A referenced object, parsed; `problem` says why there is none (missing or invalid). Neither: nothing
    was referenced."""

    value: T | None = None
    problem: Unparsed | None = None

    @property
    def missing(self) -> bool:
        return self.problem is not None and self.problem.absence is Absence.MISSING


@dataclass(frozen=True)
class Caches:
    pods: Informer
    nodes: Informer
    iscs: Informer
    lcs: Informer
    configmaps: Informer  # only the gpu-map ConfigMap


def parse(kind: type[C], cache: Informer, namespace: str, name: str) -> Parsed[C]:
    obj = cache.get(f"{namespace}/{name}")
    if obj is None:
        return Parsed(problem=Unparsed(Absence.MISSING, f"{kind.RESOURCE.kind} {name} does not exist"))
    try:
        return Parsed(kind.from_k8s(obj))
    except ValidationError as err:
        return Parsed(problem=Unparsed(Absence.INVALID, f"{kind.RESOURCE.kind} {name} is invalid: {err}"))


@dataclass(frozen=True)
class Snapshot:
    """One requester name at one moment. `provider` is the provider this pass is about: a binding left
    from an earlier requester of the name (or from one that is gone) first, else the requester's own."""

    namespace: str
    name: str
    now: float  # wall-clock epoch seconds, to compare with the API's timestamps
    requester: pods.Pod | None
    provider: pods.Pod | None
    stale: bool  # `provider` is not bound to `requester` (an earlier incarnation, or the requester is gone)
    others: tuple[str, ...]  # further providers bound to this requester: an inconsistency to report
    node: Obj | None  # the requester's Node
    provider_node: Obj | None
    view: LauncherView | None  # the bound launcher's instances (None for a direct provider)
    isc: Parsed[InferenceServerConfig]  # the requester's ISC (launcher mode only)
    launcher_config: Parsed[LauncherConfig]  # the requester's ISC's LauncherConfig
    provider_config: Parsed[LauncherConfig]  # the bound launcher's own LauncherConfig
    instance_isc: Parsed[InferenceServerConfig]  # the ISC the bound instance was made from, as it is now

    # ----- the requester

    @cached_property
    def mode(self) -> Mode:
        found = pods.annotations(self.requester) if self.requester is not None else {}
        patch, isc = keys.SERVER_PATCH_ANNOTATION in found, keys.INFERENCE_SERVER_CONFIG_ANNOTATION in found
        return Mode.BOTH if patch and isc else Mode.DIRECT if patch else Mode.LAUNCHER

    @cached_property
    def isc_name(self) -> str:
        """The requester's ISC ('' in direct mode), the label of its metrics and calls."""
        if self.requester is None or self.mode is not Mode.LAUNCHER:
            return ""
        return pods.annotations(self.requester).get(keys.INFERENCE_SERVER_CONFIG_ANNOTATION, "")

    @cached_property
    def gpus(self) -> list[str] | None:
        """The GPUs recorded in the requester's accelerators annotation (None before they are asked)."""
        return pods.accelerators(self.requester) if self.requester else None

    @property
    def requester_deleting(self) -> bool:
        return self.requester is not None and pods.is_deleting(self.requester)

    @property
    def cordoned(self) -> bool:
        """The requester's Node takes no new work (it is unschedulable)."""
        return pods.is_unschedulable(self.node)

    @property
    def bindable(self) -> bool:
        """Nothing is bound yet, and the requester's Node takes new work: a provider may be bound."""
        return self.provider is None and not self.cordoned

    # ----- the provider

    @property
    def direct_provider(self) -> bool:
        return self.provider is not None and pods.is_direct_provider(self.provider)

    @cached_property
    def wanted(self) -> str:
        """The bound launcher's instance ID ('' without a launcher binding)."""
        if self.provider is None:
            return ""
        return pods.annotations(self.provider).get(keys.INSTANCE_ID_ANNOTATION, "")

    @cached_property
    def reachable(self) -> bool:
        """The bound launcher serves its API and its instances are known."""
        return self.provider is not None and launcher_reachable(self.provider, self.view)

    @cached_property
    def instance(self) -> InstanceState | None:
        """The bound instance as its reachable launcher reports it."""
        return self.view.instances.get(self.wanted) if self.reachable and self.view is not None else None

    @cached_property
    def served(self) -> bool:
        """The requester was told (by its instance label) it is served by the bound instance."""
        return self.requester is not None and pods.labels(self.requester).get(keys.INSTANCE_LABEL) == self.wanted

    @property
    def stopped(self) -> bool:
        return self.instance is not None and self.instance.status is InstanceStatus.STOPPED

    @property
    def wake_check_failed(self) -> bool:
        """The bound instance was killed by its launcher for failing its post-wake check."""
        return self.stopped and self.instance is not None and self.instance.stop_reason is StopReason.WAKE_CHECK_FAILED

    @cached_property
    def routing_on(self) -> bool:
        """The provider still carries the routing labels its binding put on it."""
        if self.provider is None:
            return False
        labels = pods.labels(self.provider)
        return any(labels.get(k) == v for k, v in committed_routing(self.provider).labels.items())

    @property
    def provider_lost(self) -> bool:
        return self.provider is not None and pods.is_lost(self.provider, self.provider_node)

    @cached_property
    def release_deadline(self) -> float | None:
        """Until when a release waits for an unreachable launcher: UNBIND_PATIENCE_S past the requester's
        deletion, or past the moment the launcher stopped being Ready when no requester waits."""
        if self.requester is not None and not self.stale and pods.is_deleting(self.requester):
            due = pods.deletion_time(self.requester)
        else:
            due = pods.not_ready_since(self.provider) if self.provider is not None else None
        return due + UNBIND_PATIENCE_S if due is not None else None

    @property
    def patience_over(self) -> bool:
        return self.release_deadline is not None and self.now >= self.release_deadline

    @cached_property
    def unsettled(self) -> bool:
        """The requester's metadata is not yet in line with its binding (see `settle`)."""
        if self.requester is None or self.provider is None:
            return False
        return settled(self.requester, self) != self.requester


def launcher_reachable(launcher: pods.Pod, view: LauncherView | None) -> bool:
    """The launcher serves its API (it has an IP and is Ready) and its instances are known (its view synced)."""
    return pods.pod_ip(launcher) is not None and pods.is_ready(launcher) and view is not None and view.synced


def own_metadata(pod: pods.Pod) -> pods.Pod:
    """A copy of `pod` whose metadata may be changed (the rest is shared: only metadata changes)."""
    return {**pod, "metadata": copy.deepcopy(pod["metadata"])}


@dataclass(frozen=True)
class BoundNow:
    """The binding as a pass has just made it, which its snapshot does not show yet: the launcher it bound
    the requester to, and the wanted instance as that launcher reports or has just created it (None: absent)."""

    launcher: pods.Pod
    instance: InstanceState | None


def settled(requester: pods.Pod, s: Snapshot, bound_now: BoundNow | None = None) -> pods.Pod:
    """A copy of `requester` with the metadata its binding gives it: its finalizer while the provider's
    container runs, the dual label, the instance label once the instance runs, the GPUs. The binding is the
    snapshot's, or the one the pass has just made."""
    provider = bound_now.launcher if bound_now is not None else s.provider
    assert provider is not None
    pod = own_metadata(requester)
    set_finalizer(pod, keys.REQUESTER_FINALIZER, pods.container_running(provider))
    set_label(pod, keys.DUAL_LABEL, pods.name(provider))
    instance = bound_now.instance if bound_now is not None else None if s.direct_provider else s.instance
    if instance is not None and instance.status is InstanceStatus.RUNNING:
        set_label(pod, keys.INSTANCE_LABEL, instance.instance_id)
    set_annotation(pod, keys.ACCELERATORS_ANNOTATION, ",".join(s.gpus or []))
    return pod


def _bound_uid(pod: pods.Pod) -> str | None:
    binding = pods.binding(pod)
    return binding.requester_uid if binding else None


def observe(namespace: str, name: str, caches: Caches, views: ViewSource, now: float | None = None) -> Snapshot:
    """The snapshot of the requester `name` from the caches and the launcher views."""
    requester = caches.pods.get(f"{namespace}/{name}")
    bound = caches.pods.by_index(BOUND_TO, name)
    mine = [p for p in bound if requester is not None and _bound_uid(p) == pods.uid(requester)]
    stale = [p for p in bound if p not in mine]
    provider = stale[0] if stale else mine[0] if mine else None
    node_name = pods.node_name(requester) if requester is not None else None
    provider_node_name = pods.node_name(provider) if provider is not None else None
    launcher = provider is not None and not pods.is_direct_provider(provider)
    view = views.get(pods.name(provider)) if launcher and provider is not None else None
    isc_name = pods.annotations(requester).get(keys.INFERENCE_SERVER_CONFIG_ANNOTATION, "") if requester else ""
    isc = parse(InferenceServerConfig, caches.iscs, namespace, isc_name) if isc_name else Parsed[Any]()
    lc_name = isc.value.spec.launcher_config_name if isc.value is not None else ""
    state = (
        view.instances.get(pods.annotations(provider).get(keys.INSTANCE_ID_ANNOTATION, ""))
        if view and provider
        else None
    )
    instance_isc_name = (state.annotations or {}).get(keys.INSTANCE_ISC_NAME, "") if state is not None else ""
    provider_lc = pods.labels(provider).get(keys.LAUNCHER_CONFIG_NAME_LABEL, "") if launcher and provider else ""
    return Snapshot(
        namespace=namespace,
        name=name,
        now=time.time() if now is None else now,
        requester=requester,
        provider=provider,
        stale=bool(stale) or (provider is not None and requester is None),
        others=tuple(pods.name(p) for p in mine[1:]) if not stale else (),
        node=caches.nodes.get(node_name) if node_name else None,
        provider_node=caches.nodes.get(provider_node_name) if provider_node_name else None,
        view=view,
        isc=isc,
        launcher_config=parse(LauncherConfig, caches.lcs, namespace, lc_name) if lc_name else Parsed(),
        provider_config=parse(LauncherConfig, caches.lcs, namespace, provider_lc) if provider_lc else Parsed(),
        instance_isc=(
            parse(InferenceServerConfig, caches.iscs, namespace, instance_isc_name) if instance_isc_name else Parsed()
        ),
    )
