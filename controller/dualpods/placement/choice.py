"""Which free sleeper a new requester should land on, and the Pod change that asks the scheduler for it. Pure.

A requester is created with no Node; the scheduler picks one. To start hot it must land on the Node, and get the
GPUs, that hold a sleeping instance of exactly its model in an unbound launcher (a *spot*). The choice here is
among the free spots (`fleet.py` finds them) on Nodes the requester may run on (its own node selector, required
node affinity and tolerations, and a schedulable Node); the change is a *preferred* node-affinity term for that
Node (weight 100): when the spot is taken meanwhile or the Node cannot take the Pod, the scheduler places it as it
would have anyway. Only in a fleet larger than the scheduler scores in full (SCORED_IN_FULL) is the Pod also
confined, to the spot's Node and others that have room, so that the scheduler looks at the spot's Node at all.
The decision is recorded on the Pod (PLACED_ANNOTATION) for the Event, the metrics and `kubectl dualpods status`.
"""

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum

from api import keys
from controller import pods
from kube.informer import Obj

PREFERENCE_WEIGHT = 100  # the most a preferred scheduling term can weigh
# kube-scheduler scores every feasible Node only in a fleet of fewer than this many (minFeasibleNodesToFind in its
# schedule_one.go); in a larger one it stops at that many feasible Nodes (or a share of the fleet), starting where its
# last search ended, and a preferred Node outside those is never looked at. There, the requester is confined to the
# spot's Node and at most SCORED_IN_FULL - 1 others that have room: all are looked at, and the preference decides.
SCORED_IN_FULL = 100


class Result(StrEnum):
    """The outcome of one placement: also the reason of its Event and a label of dualpods_placements_total."""

    PLACED_ON_SLEEPER = "PlacedOnSleeper"  # preferred onto a free GPU holding a sleeper of its model
    NO_SLEEPER = "NoSleeper"  # opted in, but no free sleeper of its model where it may run: placed as usual
    INVALID = "PlacementInvalid"  # its placement annotation means nothing: placed as usual, and told why


@dataclass(frozen=True)
class Spot:
    """A sleeping instance of the wanted model on `gpus` of `node`, in the unbound launcher `launcher`."""

    node: str
    gpus: tuple[str, ...]
    launcher: str
    instance: str


@dataclass(frozen=True, order=True)
class Cost:
    """What taking a spot costs; the lower, the better. `uncertain`: other GPUs of its Node are free too, and under
    the device plugin the kubelet's device plugin, not the scheduler, picks among them (DRA names the GPU: the
    requester's claim does). `blocked`: the other sleepers it makes unusable (on its GPUs, or in its launcher),
    which requesters of other models arriving next may want."""

    uncertain: bool
    blocked: int


@dataclass(frozen=True)
class Decision:
    result: Result
    why: str
    spot: Spot | None = None
    # In a fleet larger than the scheduler looks at in full (SCORED_IN_FULL): the `kubernetes.io/hostname` labels of
    # the Nodes the requester is confined to, the spot's and others with room. None: anywhere.
    confined_to: tuple[str, ...] | None = None

    def annotation(self) -> str:
        return json.dumps({"result": self.result.value, "why": self.why, **(asdict(self.spot) if self.spot else {})})


def opted_in(requester_annotations: Mapping[str, str], isc_annotations: Mapping[str, str], default: bool) -> bool:
    """Whether a requester asks for sleeper-aware placement: its own annotation wins over its ISC's, and the
    chart's default decides where neither says. ValueError for a value that is neither on nor off."""
    for where, annotations in (
        ("the requester Pod", requester_annotations),
        ("its InferenceServerConfig", isc_annotations),
    ):
        value = annotations.get(keys.PLACEMENT_ANNOTATION)
        if value is None:
            continue
        if value not in (keys.PLACEMENT_PREFER_SLEEPER, keys.PLACEMENT_OFF):
            raise ValueError(
                f"{keys.PLACEMENT_ANNOTATION}: {value!r} on {where} is neither "
                f"{keys.PLACEMENT_PREFER_SLEEPER!r} nor {keys.PLACEMENT_OFF!r}"
            )
        return value == keys.PLACEMENT_PREFER_SLEEPER
    return default


OPTED_IN_CONDITION = "opted-in"  # the webhook's match condition that the leader keeps (webhook.py)


def opted_in_expression(isc_values: Mapping[str, str], default_on: bool) -> str:
    """CEL, over the Pod being created, that holds for the requesters whose placement is to be decided (`opted_in`,
    given the placement annotation of each ISC that carries one: `isc_values`), so that the API server sends the
    webhook no other: a requester's own annotation decides (anything but `off` is sent, a value that means nothing
    too: it gets its Event), else its ISC's, else the default."""
    annotations = "object.metadata.annotations"
    key, off = json.dumps(keys.PLACEMENT_ANNOTATION), json.dumps(keys.PLACEMENT_OFF)
    isc = f"{annotations}[{json.dumps(keys.INFERENCE_SERVER_CONFIG_ANNOTATION)}]"
    if default_on:
        by_isc = f"!({isc} in {json.dumps(sorted(n for n, v in isc_values.items() if v == keys.PLACEMENT_OFF))})"
    else:
        by_isc = f"{isc} in {json.dumps(sorted(n for n, v in isc_values.items() if v != keys.PLACEMENT_OFF))}"
    return f"has({annotations}) && ({key} in {annotations} ? {annotations}[{key}] != {off} : {by_isc})"


def gpus_asked(spec: Obj) -> int | None:
    """How many GPUs the Pod asks the scheduler for through the device plugin; None where its GPUs come from
    ResourceClaims (DRA: the claim says), 0 where it asks for none (FMA's GPU pin: it names its GPU itself)."""
    if spec.get("resourceClaims"):
        return None
    total = 0
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        count = (resources.get("limits") or {}).get(keys.GPU_RESOURCE) or (resources.get("requests") or {}).get(
            keys.GPU_RESOURCE
        )
        total += int(count or 0)
    return total


def choose(spots: Mapping[Spot, Cost], nodes: Mapping[str, Obj], spec: Obj, seed: str) -> Spot | None:
    """The spot for a requester of Pod spec `spec` among free `spots`, on a Node it may run on: the one of lowest
    cost (fleet.Cost); spots that are equally good are ranked by a hash of `seed` (the admission request's UID), so
    that requesters arriving together spread over them."""
    fitting = [s for s in spots if (node := nodes.get(s.node)) is not None and may_run_on(node, spec)]
    if not fitting:
        return None
    return min(
        fitting,
        key=lambda s: (spots[s], hashlib.blake2b(f"{seed}/{s.node}/{s.gpus}".encode(), digest_size=8).digest()),
    )


def may_run_on(node: Obj, spec: Obj) -> bool:
    """Whether the scheduler's node filters that read the Pod's own constraints pass: the Node is schedulable, its
    labels match the node selector and required node affinity, and the Pod tolerates its hard taints."""
    if pods.is_cordoned(node):
        return False
    labels = (node.get("metadata") or {}).get("labels") or {}
    if any(labels.get(key) != value for key, value in (spec.get("nodeSelector") or {}).items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is not None and not any(_term_matches(term, node) for term in required.get("nodeSelectorTerms") or []):
        return False
    tolerations = spec.get("tolerations") or []
    return all(
        any(_tolerates(t, taint) for t in tolerations)
        for taint in (node.get("spec") or {}).get("taints") or []
        if taint.get("effect") in ("NoSchedule", "NoExecute")
    )


def _term_matches(term: Obj, node: Obj) -> bool:
    """A NodeSelectorTerm: all its label expressions and field expressions hold (an empty term matches nothing)."""
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    labels = (node.get("metadata") or {}).get("labels") or {}
    name = (node.get("metadata") or {}).get("name", "")
    return all(_requirement_holds(r, labels) for r in expressions) and all(
        _requirement_holds(r, {"metadata.name": name}) for r in fields
    )


def _requirement_holds(requirement: Obj, labels: Mapping[str, str]) -> bool:
    key, operator, values = requirement.get("key", ""), requirement.get("operator"), requirement.get("values") or []
    value = labels.get(key)
    if operator == "In":
        return value in values
    if operator == "NotIn":
        return value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and values:
        try:
            found, bound = int(value), int(values[0])
        except ValueError:
            return False
        return found > bound if operator == "Gt" else found < bound
    return False


def _tolerates(toleration: Obj, taint: Obj) -> bool:
    effect = toleration.get("effect")
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key")
    if toleration.get("operator") == "Exists":
        return not key or key == taint.get("key")
    return key == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


def patch(pod: Obj, decision: Decision, claim_templates: Mapping[int, str] | None = None) -> list[Obj]:
    """The JSON patch (RFC 6902) that carries `decision` out on the Pod as created: the decision annotation and,
    with a spot, a preferred node-affinity term for its Node beside the Pod's own terms, and its claims made from
    the templates `claim_templates` names (by the claim's index) instead of their own."""
    key = keys.PLACED_ANNOTATION.replace("~", "~0").replace("/", "~1")
    ops: list[Obj] = []
    if not (pod.get("metadata") or {}).get("annotations"):
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    ops.append({"op": "add", "path": f"/metadata/annotations/{key}", "value": decision.annotation()})
    if decision.spot is not None:
        affinity = dict((pod.get("spec") or {}).get("affinity") or {})
        node_affinity = dict(affinity.get("nodeAffinity") or {})
        preferred = list(node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or [])
        preferred.append({
            "weight": PREFERENCE_WEIGHT,
            "preference": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [decision.spot.node]}]},
        })  # fmt: skip
        node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
        if decision.confined_to is not None:
            node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = _confined(
                node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"), list(decision.confined_to)
            )
        affinity["nodeAffinity"] = node_affinity
        ops.append({"op": "add", "path": "/spec/affinity", "value": affinity})
    for index, template in sorted((claim_templates or {}).items()):
        ops.append({"op": "add", "path": f"/spec/resourceClaims/{index}/resourceClaimTemplateName", "value": template})
    return ops


def _confined(required: Obj | None, hostnames: list[str]) -> Obj:
    """The Pod's required node affinity, each of its terms (any of which may hold) narrowed to the Nodes of these
    `kubernetes.io/hostname` labels (a field selector on the Node's name takes one value only)."""
    within = {"key": keys.HOSTNAME_LABEL, "operator": "In", "values": hostnames}
    terms = [dict(term) for term in (required or {}).get("nodeSelectorTerms") or [{}]]
    for term in terms:
        term["matchExpressions"] = [*(term.get("matchExpressions") or []), within]
    return {**(required or {}), "nodeSelectorTerms": terms}


def decided(pod: Obj) -> Decision | None:
    """The decision recorded on a Pod, if any (None also for an annotation that does not parse)."""
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.PLACED_ANNOTATION)
    if not text:
        return None
    try:
        found = json.loads(text)
        spot = None
        if "node" in found:
            spot = Spot(found["node"], tuple(found["gpus"]), found["launcher"], found["instance"])
        return Decision(Result(found["result"]), str(found.get("why", "")), spot)
    except (ValueError, KeyError, TypeError):
        return None
