"""The free spots of a model: where a new requester of it could start hot, read from the dual-pods controller's
Pod cache and launcher views (what its reconciles read; nothing is asked of the API server or a launcher).

A spot is a sleeping instance whose ID is exactly the one the requester would ask for on those GPUs (the same
ISC, runtime and GPUs: `identity.instance_id`), in a launcher of the ISC's LauncherConfig that is Ready and
unbound, on GPUs that nothing holds: no awake or starting instance of any launcher on the Node uses them, no
requester there has them (its recorded accelerators), no requester is on its way to them (placed there and not
yet told its GPUs, or admitted a moment ago: `Reservations`), and the Node has room beyond the requesters whose
GPUs are not known yet.

The candidates come from the launchers whose instance summary names the ISC (LAUNCHERS_BY_SUMMARY_ISC), so the
cost of a placement grows with the model's launchers, not the fleet's.
"""

import collections
import hashlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from api import keys
from api.crds import InferenceServerConfig, LauncherConfig
from api.launcher import InstanceState
from controller import pods
from controller.dualpods.gpu_map import gpu_locations
from controller.dualpods.identity import instance_id
from controller.dualpods.isc_status import LAUNCHERS_BY_SUMMARY_ISC
from controller.dualpods.placement.choice import Cost, Spot, decided, gpus_asked, may_run_on
from controller.dualpods.snapshot import Caches
from controller.launcher_template import launcher_config_hash
from controller.launcher_views import ViewSource
from kube.informer import Obj

LAUNCHERS_ON_NODE = "launchers-on-node"  # pod index: node -> its launchers
REQUESTERS_ON_NODE = "requesters-on-node"  # pod index: node -> its requesters
PLACED_PENDING = "placed-pending"  # pod index: node -> requesters placed there and not scheduled yet
RESERVED_S = 10.0  # a spot promised at admission is held this long for a Pod the cache does not show yet


def launchers_on_node(pod: Obj) -> list[str]:
    node = pods.node_name(pod)
    return [node] if node and pods.is_launcher(pod) else []


def requesters_on_node(pod: Obj) -> list[str]:
    node = pods.node_name(pod)
    return [node] if node and pods.is_requester(pod) else []


def placed_pending(pod: Obj) -> list[str]:
    if pods.node_name(pod) or not pods.is_requester(pod):
        return []
    decision = decided(pod)
    return [decision.spot.node] if decision is not None and decision.spot is not None else []


INDEXES = {LAUNCHERS_ON_NODE: launchers_on_node, REQUESTERS_ON_NODE: requesters_on_node, PLACED_PENDING: placed_pending}


@dataclass
class Reservations:
    """Spots promised by admissions in the last RESERVED_S whose Pod the cache does not show yet: the next admission
    must not promise the same GPUs or launcher again."""

    clock: Callable[[], float] = time.monotonic
    _held: dict[Spot, float] = field(default_factory=dict)

    def add(self, spot: Spot) -> None:
        self._held[spot] = self.clock() + RESERVED_S

    def release(self, spot: Spot) -> None:
        """The Pod that carries the promise is in the cache: it holds the spot from now on."""
        self._held.pop(spot, None)

    def current(self) -> list[Spot]:
        now = self.clock()
        self._held = {spot: until for spot, until in self._held.items() if until > now}
        return list(self._held)


class FleetReader:
    """Reads the free spots of a model from the controller's caches (which must carry INDEXES and
    LAUNCHERS_BY_SUMMARY_ISC) and launcher views."""

    def __init__(self, namespace: str, caches: Caches, views: ViewSource) -> None:
        self.namespace = namespace
        self.caches = caches
        self.views = views
        self._gpus: tuple[str | None, dict[str, list[str]]] = (None, {})

    def spots(
        self, isc: InferenceServerConfig, lc: LauncherConfig, template_hash: str, runtime: str, reserved: list[Spot]
    ) -> dict[Spot, Cost]:
        """The free spots of `isc` (its instances for `runtime`) in launchers of `lc` (of `template_hash`), each with
        what taking it costs."""
        promised_gpus = {(s.node, gpu) for s in reserved for gpu in s.gpus}
        promised_launchers = {s.launcher for s in reserved}
        wanted: dict[tuple[str, ...], str] = {}
        found: dict[Spot, Cost] = {}
        nodes: dict[str, NodeUse] = {}
        for launcher in self.caches.pods.by_index(LAUNCHERS_BY_SUMMARY_ISC, isc.metadata.name):
            name, node = pods.name(launcher), pods.node_name(launcher)
            if (
                node is None
                or name in promised_launchers
                or pods.binding(launcher) is not None
                or pods.is_deleting(launcher)
                or not pods.is_ready(launcher)
                or pods.annotations(launcher).get(keys.LAUNCHER_CONFIG_HASH_ANNOTATION)
                != launcher_config_hash(template_hash, node)
            ):
                continue
            view = self.views.get(name)
            if view is None or not view.synced:
                continue
            for state in view.instances.values():
                gpus = tuple(state.gpu_uuids or ())
                if not (state.sleeping and gpus) or state.exit_code is not None:
                    continue
                if gpus not in wanted:
                    wanted[gpus] = instance_id(isc, list(gpus), runtime)
                if state.instance_id != wanted[gpus]:
                    continue
                use = nodes.get(node) or nodes.setdefault(node, self.use_of(node))
                if use.free(gpus, promised_gpus) and name not in use.claimed:
                    blocked = sum(use.sleepers[gpu] for gpu in gpus) + _sleepers(view.instances.values()) - 2
                    found[Spot(node, gpus, name, state.instance_id)] = Cost(not use.only_free(gpus), blocked)
        return found

    def gpus_on(self, node: str) -> list[str]:
        """The GPU UUIDs the gpu-map lists for `node`."""
        return self._gpus_listed().get(node, [])

    def _gpus_listed(self) -> dict[str, list[str]]:
        """Node -> the GPUs the gpu-map lists for it (parsed once per version of the map)."""
        configmap = self.caches.configmaps.get(f"{self.namespace}/{keys.GPU_MAP_CONFIGMAP}") or {}
        version = (configmap.get("metadata") or {}).get("resourceVersion", "")
        if self._gpus[0] != version:
            listed: dict[str, list[str]] = collections.defaultdict(list)
            for uuid, where in sorted(gpu_locations(configmap).items(), key=lambda item: item[1].index):
                listed[where.node].append(uuid)
            self._gpus = (version, dict(listed))
        return self._gpus[1]

    def confinement(self, spec: Obj, spot: Spot, limit: int, seed: str) -> tuple[str, ...] | None:
        """The hostname labels of `spot`'s Node and of up to `limit` - 1 others where a Pod of spec `spec` may run now
        (its own constraints, and as many GPUs free as the spot's), in an order of `seed`'s; None when the fleet has
        at most `limit` Nodes (the scheduler looks at every one), or the spot's Node has no hostname label."""
        nodes = self.caches.nodes.items()
        own = _hostname(self.caches.nodes.get(spot.node))
        if len(nodes) <= limit or own is None:
            return None
        ranked = sorted(nodes, key=lambda n: hashlib.blake2b(f"{seed}/{pods.name(n)}".encode(), digest_size=8).digest())
        found = [own]
        for node in ranked:
            name, hostname = pods.name(node), _hostname(node)
            if hostname is None or name == spot.node or not may_run_on(node, spec):
                continue
            if self.use_of(name).room() >= len(spot.gpus):
                found.append(hostname)
                if len(found) == limit:
                    break
        return tuple(found)

    def use_of(self, node: str, reserved: Iterable[Spot] = ()) -> "NodeUse":
        """What holds the GPUs of `node` now; `reserved`: spots promised at admission, whose Pods are not cached."""
        awake: set[str] = set()
        held: dict[str, set[str]] = collections.defaultdict(set)
        for spot in reserved:
            for gpu in spot.gpus if spot.node == node else ():
                held[gpu].add("")  # a requester on its way, whose model the promise does not say
        sleepers: collections.Counter[str] = collections.Counter()
        for launcher in self.caches.pods.by_index(LAUNCHERS_ON_NODE, node):
            view = self.views.get(pods.name(launcher))
            for state in view.instances.values() if view is not None else []:
                if state.exit_code is not None:
                    continue
                if state.sleeping:
                    sleepers.update(state.gpu_uuids or ())
                else:
                    awake.update(state.gpu_uuids or ())
        unknown = 0
        claimed: set[str] = set()  # launchers that requesters placed on them are on their way to bind
        for requester in self.caches.pods.by_index(REQUESTERS_ON_NODE, node):
            if pods.is_failed(requester):
                continue
            gpus = _held_gpus(requester, node)
            if gpus is None:
                unknown += gpus_asked(requester.get("spec") or {}) or 1
            _hold(held, requester, gpus or ())
            claimed.update(_claimed_launcher(requester, node))
        for requester in self.caches.pods.by_index(PLACED_PENDING, node):
            _hold(held, requester, _held_gpus(requester, node) or ())
            claimed.update(_claimed_launcher(requester, node))
        return NodeUse(node, awake | set(held), unknown, self._capacity(node), sleepers, claimed, dict(held), awake)

    def _capacity(self, node: str) -> int | None:
        """The Node's GPUs: those the gpu-map lists for it, else its allocatable `nvidia.com/gpu`."""
        listed = self._gpus_listed().get(node)
        if listed:
            return len(listed)
        found = self.caches.nodes.get(node)
        allocatable = ((found or {}).get("status") or {}).get("allocatable") or {}
        return int(allocatable[keys.GPU_RESOURCE]) if keys.GPU_RESOURCE in allocatable else None


@dataclass(frozen=True)
class NodeUse:
    node: str
    busy: set[str]  # GPUs held: by an awake or starting instance, or a requester that has or is promised them
    unknown: int  # GPUs held by requesters there whose GPUs are not known yet
    capacity: int | None  # the Node's GPUs, where known
    sleepers: collections.Counter[str]  # GPU -> the sleeping instances on it
    claimed: set[str]  # launchers promised to requesters placed there, not bound yet
    held: dict[str, set[str]]  # of `busy`, those of requesters (or promised to them) -> their ISCs ("": not known)
    awake: set[str]  # of `busy`, those of awake or starting instances

    def free(self, gpus: Iterable[str], promised: set[tuple[str, str]]) -> bool:
        wanted = set(gpus)
        if wanted & self.busy or any((self.node, gpu) in promised for gpu in wanted):
            return False
        return self.capacity is None or self.capacity - len(self.busy) - self.unknown >= len(wanted)

    def room(self) -> int:
        """GPUs free on the Node (a Node whose GPUs are not known has room for one)."""
        return 1 if self.capacity is None else self.capacity - len(self.busy) - self.unknown

    def only_free(self, gpus: tuple[str, ...]) -> bool:
        """Whether `gpus` are all the Node has free: a device plugin, which picks among the free ones, must pick
        them."""
        return self.capacity is not None and self.capacity - len(self.busy) - self.unknown == len(gpus)


def _claimed_launcher(requester: Obj, node: str) -> list[str]:
    """The launcher of the spot a requester was placed on at `node`, while it is on its way to bind it (a bound
    launcher shows its binding itself; a requester being deleted binds nothing)."""
    decision = decided(requester)
    spot = decision.spot if decision is not None else None
    coming = keys.DUAL_LABEL not in pods.labels(requester) and not pods.is_deleting(requester)
    return [spot.launcher] if spot is not None and spot.node == node and coming else []


def _hold(held: dict[str, set[str]], requester: Obj, gpus: Iterable[str]) -> None:
    """Record that `requester` holds `gpus`, for its ISC ("" for a requester of a server patch)."""
    isc = pods.annotations(requester).get(keys.INFERENCE_SERVER_CONFIG_ANNOTATION, "")
    for gpu in gpus:
        held[gpu].add(isc)


def _hostname(node: Obj | None) -> str | None:
    labels = ((node or {}).get("metadata") or {}).get("labels") or {}
    return labels.get(keys.HOSTNAME_LABEL)


def _sleepers(states: Iterable[InstanceState]) -> int:
    return sum(1 for state in states if state.sleeping and state.exit_code is None)


def _held_gpus(requester: Obj, node: str) -> list[str] | None:
    """The GPUs a requester holds or is on its way to on `node`: its recorded accelerators, else those of the
    spot it was placed on (when it is not scheduled yet, or scheduled there); None when not known."""
    accelerators = pods.accelerators(requester)
    if accelerators is not None:
        return accelerators
    decision = decided(requester)
    if decision is not None and decision.spot is not None and pods.node_name(requester) in (None, node):
        return list(decision.spot.gpus) if decision.spot.node == node else None
    return None
