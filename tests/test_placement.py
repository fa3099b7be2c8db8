"""Sleeper-aware placement (E22): the admission webhook's decision and patch, over the controller's own caches
and indexes filled by hand (tests/test_dualpods_fakes.py). e2e/test_placement.py runs it behind the real API
server and scheduler."""

import base64
import copy
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes_asyncio import client

from api import keys
from api.crds import LauncherConfig
from controller.dualpods.placement.admission import BadReview
from controller.dualpods.placement.choice import (
    OPTED_IN_CONDITION,
    PREFERENCE_WEIGHT,
    Decision,
    Result,
    Spot,
    decided,
    may_run_on,
    opted_in_expression,
)
from controller.dualpods.placement.claim_templates import derive, derived_name
from controller.dualpods.placement.fleet import RESERVED_S, Reservations
from controller.dualpods.placement.webhook import Registration
from controller.fleet_view import as_table, fleet_status
from controller.launcher_template import node_independent_pod, pod_for_node
from kube.informer import Obj
from tests.test_dualpods_fakes import (
    GPU0,
    GPU1,
    ISC,
    LAUNCHER,
    NODE,
    WANTED,
    Harness,
    bound,
    gpu_map_obj,
    harness,
    inst,
    isc_obj,
    launcher_obj,
    lc_obj,
    node_obj,
    on_node,
    requester_obj,
    summarized,
    wanted_id,
)

OPT_IN = {keys.PLACEMENT_ANNOTATION: keys.PLACEMENT_PREFER_SLEEPER}


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    """A Node with two GPUs and one unbound launcher holding the ISC's instance asleep on GPU0; the ISC opted in."""
    async with harness() as made:
        made.put(node_obj(), isc_obj() | _isc_meta(OPT_IN), lc_obj(), gpu_map_obj())
        sleeper = inst(WANTED, gpus=(GPU0,))
        launcher = summarized(launcher_obj(), sleeper)
        made.put(launcher)
        made.views.put(launcher, sleeper)
        yield made


def _isc_meta(annotations: dict[str, str]) -> Obj:
    """The ISC's metadata with `annotations` (merged over an ISC, it opts the ISC in or out)."""
    made = isc_obj()
    made["metadata"]["annotations"] = annotations
    return {"metadata": made["metadata"]}


def new_requester(annotations: dict[str, str] | None = None, gpus: int = 1, **spec: Any) -> Obj:
    """A requester Pod as a ReplicaSet submits it: no name yet, no Node, asking the device plugin for `gpus`."""
    resources = {"limits": {keys.GPU_RESOURCE: str(gpus)}, "requests": {keys.GPU_RESOURCE: str(gpus)}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "req-",
            "namespace": "ns",
            "annotations": {keys.INFERENCE_SERVER_CONFIG_ANNOTATION: ISC, **(annotations or {})},
        },
        "spec": {"containers": [{"name": keys.INFERENCE_SERVER_CONTAINER, "resources": resources}], **spec},
    }


async def review(h: Harness, pod: Obj, uid: str = "review-1") -> Obj:
    request = {"uid": uid, "operation": "CREATE", "object": pod}
    answer: Obj = await h.controller.placement.review({"apiVersion": "admission.k8s.io/v1", "request": request})
    assert answer["response"]["allowed"] is True
    assert answer["response"]["uid"] == uid
    response: Obj = answer["response"]
    return response


def patched(pod: Obj, response: Obj) -> Obj:
    """`pod` with the response's JSON patch applied (its `add` operations: all the webhook writes)."""
    result = copy.deepcopy(pod)
    for op in json.loads(base64.b64decode(response["patch"])):
        assert op["op"] == "add"
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target: Any = result
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            target[int(last)] = op["value"]  # a list member is only ever replaced here
        else:
            target[last] = op["value"]
    return result


def preferred_nodes(pod: Obj) -> list[str]:
    terms = pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    return [
        value
        for term in terms
        if term["weight"] == PREFERENCE_WEIGHT
        for field in term["preference"]["matchFields"]
        for value in field["values"]
    ]


async def test_an_opted_in_requester_is_preferred_onto_the_gpu_holding_its_models_sleeper(h: Harness) -> None:
    pod = new_requester()
    placed = patched(pod, await review(h, pod))
    assert preferred_nodes(placed) == [NODE]
    decision = decided(placed)
    assert decision == Decision(
        Result.PLACED_ON_SLEEPER, decision.why if decision else "", Spot(NODE, (GPU0,), LAUNCHER, WANTED)
    )
    assert h.metric("dualpods_placements_total", exported_namespace="ns", result="PlacedOnSleeper") == 1


async def test_a_requester_that_did_not_opt_in_is_left_exactly_as_created(h: Harness) -> None:
    h.put(isc_obj())  # the ISC says nothing; the chart's default is off
    response = await review(h, new_requester())
    assert "patch" not in response
    response = await review(h, new_requester({keys.PLACEMENT_ANNOTATION: keys.PLACEMENT_OFF}))
    assert "patch" not in response


async def test_the_requesters_own_annotation_wins_over_its_iscs(h: Harness) -> None:
    h.put(isc_obj())
    pod = new_requester(OPT_IN)
    assert preferred_nodes(patched(pod, await review(h, pod))) == [NODE]


async def test_a_placement_annotation_that_means_nothing_is_reported_and_places_nothing(h: Harness) -> None:
    pod = new_requester({keys.PLACEMENT_ANNOTATION: "nearby"})
    placed = patched(pod, await review(h, pod))
    decision = decided(placed)
    assert decision is not None
    assert decision.result is Result.INVALID
    assert "'nearby'" in decision.why
    assert "affinity" not in placed["spec"]


@pytest.mark.parametrize(
    "taken",
    ["launcher bound", "gpu serving", "requester on the gpu", "instance of another isc spec", "launcher not ready"],
)
async def test_no_spot_when_the_sleeper_cannot_be_woken_there(h: Harness, taken: str) -> None:
    launcher = summarized(launcher_obj(), inst(WANTED))
    if taken == "launcher bound":
        h.put(bound(launcher, requester_obj(name="other", uid="other-uid", gpus=(GPU1,)), gpus=(GPU1,)))
    elif taken == "gpu serving":
        other = summarized(launcher_obj("launcher-2"), inst("Iotheri", gpus=(GPU0,), sleeping=False))
        h.put(other)
        h.views.put(other, inst("Iotheri", gpus=(GPU0,), sleeping=False))
    elif taken == "requester on the gpu":
        h.put(requester_obj(name="other", uid="other-uid", gpus=(GPU0,)))
    elif taken == "instance of another isc spec":
        h.put(isc_obj(options="--model /models/b") | _isc_meta(OPT_IN))
    else:
        h.put(launcher_obj(ready=False) | {"metadata": launcher["metadata"]})
    pod = new_requester()
    placed = patched(pod, await review(h, pod))
    decision = decided(placed)
    assert decision is not None
    assert decision.result is Result.NO_SLEEPER
    assert "affinity" not in placed["spec"]


async def test_a_node_full_of_requesters_whose_gpus_are_unknown_has_no_spot(h: Harness) -> None:
    for i in range(2):  # the Node's two GPUs, held by requesters that have not been asked theirs yet
        h.put(requester_obj(name=f"other-{i}", uid=f"other-{i}", gpus=None))
    assert decided(patched(new_requester(), await review(h, new_requester()))) == Decision(
        Result.NO_SLEEPER, f"no free GPU holds a sleeping instance of {ISC} on a Node this requester may run on"
    )


async def test_two_requesters_admitted_together_are_not_promised_the_same_sleeper(h: Harness) -> None:
    first, second = new_requester(), new_requester()
    assert preferred_nodes(patched(first, await review(h, first, "a"))) == [NODE]
    decision = decided(patched(second, await review(h, second, "b")))
    assert decision is not None
    assert decision.result is Result.NO_SLEEPER


async def test_a_promise_lapses_when_its_pod_never_shows_up(h: Harness) -> None:
    now = [0.0]
    h.controller.placement.reservations.clock = lambda: now[0]
    pod = new_requester()
    await review(h, pod, "a")
    now[0] += RESERVED_S + 0.1
    assert preferred_nodes(patched(pod, await review(h, pod, "b"))) == [NODE]


async def test_a_placed_requester_not_scheduled_yet_holds_its_spot(h: Harness) -> None:
    pod = new_requester()
    placed = patched(pod, await review(h, pod, "a"))
    placed["metadata"] |= {"name": "req-1", "uid": "req-1-uid", "resourceVersion": "1"}
    h.put(placed)
    h.controller.placement.reservations = Reservations()  # the promise lapsed; the Pod holds the spot now
    decision = decided(patched(pod, await review(h, pod, "b")))
    assert decision is not None
    assert decision.result is Result.NO_SLEEPER


async def test_a_dry_run_promises_nothing(h: Harness) -> None:
    pod = new_requester()
    request = {"uid": "dry", "operation": "CREATE", "object": pod, "dryRun": True}
    await h.controller.placement.review({"request": request})
    assert preferred_nodes(patched(pod, await review(h, pod))) == [NODE]


async def test_the_requesters_own_affinity_stays_beside_the_preference(h: Harness) -> None:
    own: Obj = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 5, "preference": {"matchExpressions": [{"key": "big", "operator": "Exists"}]}}
            ],
        },
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
    }
    h.put(node_obj() | {"metadata": {"name": NODE, "uid": "n", "resourceVersion": "2", "labels": {"zone": "a"}}})
    pod = new_requester(affinity=own)
    placed = patched(pod, await review(h, pod))
    affinity = placed["spec"]["affinity"]
    assert affinity["podAntiAffinity"] == own["podAntiAffinity"]
    node_affinity = affinity["nodeAffinity"]
    assert (
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]
        == (own["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"])
    )
    assert node_affinity["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 5
    assert preferred_nodes(placed) == [NODE]


@pytest.mark.parametrize(
    ("constraint", "fits"),
    [
        ({"nodeSelector": {"zone": "b"}}, False),
        ({"nodeSelector": {"zone": "a"}}, True),
        ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": [NODE]}]}]}}}}, False),
        ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["1"]}]}]}}}}, True),
        ({"tolerations": []}, False),
        ({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}]}, True),
        ({"tolerations": [{"operator": "Exists"}]}, True),
    ],
)  # fmt: skip
def test_a_node_the_requester_may_not_run_on_is_never_preferred(constraint: Obj, fits: bool) -> None:
    node = node_obj() | {"metadata": {"name": NODE, "labels": {"zone": "a", "gpus": "2"}}}
    node["spec"]["taints"] = [{"key": "dedicated", "value": "llm", "effect": "NoSchedule"}]
    spec: Obj = {"tolerations": [{"key": "dedicated", "operator": "Exists"}]} | constraint
    assert may_run_on(node, spec) is fits
    assert may_run_on(node_obj(unschedulable=True), {}) is False


async def test_a_requester_whose_gpu_is_pinned_gets_no_preference(h: Harness) -> None:
    placed = patched(new_requester(gpus=0), await review(h, new_requester(gpus=0)))
    decision = decided(placed)
    assert decision is not None
    assert decision.result is Result.NO_SLEEPER
    assert "pinned" in decision.why


async def test_a_sleeper_of_two_gpus_is_a_spot_for_a_requester_of_two(h: Harness) -> None:
    pair = wanted_id(gpus=(GPU0, GPU1))
    launcher = summarized(launcher_obj(), inst(pair, gpus=(GPU0, GPU1)))
    h.put(launcher)
    h.views.put(launcher, inst(pair, gpus=(GPU0, GPU1)))
    decision = decided(patched(new_requester(gpus=2), await review(h, new_requester(gpus=2))))
    assert decision is not None
    assert decision.spot == Spot(NODE, (GPU0, GPU1), LAUNCHER, pair)
    decision = decided(patched(new_requester(gpus=1), await review(h, new_requester(gpus=1), "b")))
    assert decision is not None
    assert decision.result is Result.NO_SLEEPER


@pytest.mark.parametrize(
    "body",
    [None, [], {"request": {}}, {"request": {"uid": "x", "operation": "UPDATE", "object": {}}}],
)
async def test_a_body_that_is_not_a_review_of_a_creation_is_refused(h: Harness, body: Any) -> None:
    with pytest.raises(BadReview):
        await h.controller.placement.review(body)


async def test_each_placed_requester_is_told_once_with_an_event(h: Harness) -> None:
    pod = new_requester()
    placed = patched(pod, await review(h, pod))
    created = datetime.now(UTC).isoformat()
    placed["metadata"] |= {"name": "req-1", "uid": "req-1-uid", "resourceVersion": "1", "creationTimestamp": created}
    h.put(placed)
    assert ("placement", "req-1") in await h.queued()
    await h.controller.announcer.announce("req-1")
    await h.controller.announcer.announce("req-1")
    events = [c.detail for c in h.journal.of("event") if c.detail[1] == "PlacedOnSleeper"]
    assert len(events) == 1
    assert events[0][0] == "Normal"
    assert GPU0 in events[0][2]
    h.caches.pods.upsert(placed | {"metadata": placed["metadata"] | {"resourceVersion": "2"}})  # a later change
    assert ("placement", "req-1") not in await h.queued()


def one_gpu_template(**exactly: Any) -> Obj:
    """A ResourceClaimTemplate as users write them for NVIDIA's DRA driver: one request of one GPU."""
    request = {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1, **exactly}}
    return {
        "metadata": {"name": "one-gpu", "namespace": "ns", "uid": "t-uid"},
        "spec": {"metadata": {"labels": {"team": "a"}}, "spec": {"devices": {"requests": [request]}}},
    }


def test_a_derived_template_asks_for_the_sleepers_gpu_first_then_as_the_original_does() -> None:
    own_selector = {"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName == 'H100'"}}
    derived = derive(one_gpu_template(selectors=[own_selector]), (GPU0,))
    assert derived is not None
    assert derived["metadata"]["name"] == derived_name(one_gpu_template(), (GPU0,))
    assert derived["metadata"]["ownerReferences"][0]["uid"] == "t-uid"
    assert derived["spec"]["metadata"] == {"labels": {"team": "a"}}
    (request,) = derived["spec"]["spec"]["devices"]["requests"]
    sleeper, as_asked = request["firstAvailable"]
    assert request["name"] == "gpus"
    assert as_asked == {
        "name": "as-asked",
        "deviceClassName": "gpu.nvidia.com",
        "count": 1,
        "selectors": [own_selector],
    }
    assert sleeper["selectors"][0] == own_selector
    assert f'.uuid in ["{GPU0}"]' in sleeper["selectors"][1]["cel"]["expression"]
    assert derived_name(one_gpu_template(), (GPU1,)) != derived_name(one_gpu_template(), (GPU0,))


@pytest.mark.parametrize("exactly", [{"count": 2}, {"adminAccess": True}, {"allocationMode": "All"}])
def test_a_template_that_does_not_ask_for_exactly_the_sleepers_gpus_is_not_derived(exactly: Obj) -> None:
    assert derive(one_gpu_template(**exactly), (GPU0,)) is None


class FakeClaimTemplates:
    """Stands in for the API server's ResourceClaimTemplates (KubeClaimTemplates): the derived names it gave."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, tuple[str, ...]]] = []

    async def prefer(self, namespace: str, template: str, gpus: tuple[str, ...]) -> str | None:
        self.asked.append((namespace, template, gpus))
        return f"{template}-derived"


async def test_a_dra_requester_gets_its_claim_from_the_template_preferring_the_sleepers_gpu(h: Harness) -> None:
    templates = FakeClaimTemplates()
    h.controller.placement.templates = templates
    pod = new_requester(gpus=0, resourceClaims=[{"name": "gpus", "resourceClaimTemplateName": "one-gpu"}])
    placed = patched(pod, await review(h, pod))
    assert preferred_nodes(placed) == [NODE]
    assert placed["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "one-gpu-derived"}]
    assert templates.asked == [("ns", "one-gpu", (GPU0,))]
    request = {"uid": "dry", "operation": "CREATE", "object": pod, "dryRun": True}
    await h.controller.placement.review({"request": request})
    assert len(templates.asked) == 1  # a dry run makes nothing


def launcher_on(node: str, name: str) -> Obj:
    """An unbound launcher of the LauncherConfig on `node`, as the populator makes them."""
    template, template_hash = node_independent_pod(LauncherConfig.from_k8s(lc_obj()))
    pod = pod_for_node(template, template_hash, node)
    del pod["metadata"]["generateName"]
    pod["metadata"].update(name=name, uid=f"{name}-uid", resourceVersion="1", finalizers=[])
    on_node(pod, ip="127.0.2.1", ready=True, running=True, restarts=0)
    pod["spec"]["nodeName"] = node
    return pod


@pytest.mark.parametrize("seed", [f"review-{i}" for i in range(8)])
async def test_a_sleeper_on_its_nodes_only_free_gpu_is_preferred_under_the_device_plugin(h: Harness, seed: str) -> None:
    """NODE's other GPU is taken, so the device plugin must give the requester the sleeper's; on node-b it could
    give either of two."""
    other_gpus = ("GPU-b0", "GPU-b1")
    h.put(node_obj("node-b"), gpu_map_obj({NODE: {GPU0: 0, GPU1: 1}, "node-b": {"GPU-b0": 0, "GPU-b1": 1}}))
    h.put(requester_obj(name="other", uid="other-uid", gpus=(GPU1,)))
    sleeper = inst(wanted_id(gpus=other_gpus[:1]), gpus=other_gpus[:1])
    launcher = summarized(launcher_on("node-b", "launcher-b"), sleeper)
    h.put(launcher)
    h.views.put(launcher, sleeper)
    decision = decided(patched(new_requester(), await review(h, new_requester(), seed)))
    assert decision is not None
    assert decision.spot == Spot(NODE, (GPU0,), LAUNCHER, WANTED)
    dra = new_requester(gpus=0, resourceClaims=[{"name": "gpus", "resourceClaimTemplateName": "one-gpu"}])
    decision = decided(patched(dra, await review(h, dra, seed + "-dra")))
    assert decision is not None  # under DRA the claim names the GPU: both spots are as good
    assert decision.spot is not None


def named(node: Obj) -> Obj:
    """`node` with its hostname label (here, unlike on most clusters, not its name: the Pod names the label's)."""
    node["metadata"]["labels"] = {keys.HOSTNAME_LABEL: f"host-{node['metadata']['name']}"}
    return node


def required_terms(pod: Obj) -> list[Obj]:
    terms: list[Obj] = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    return terms


async def test_in_a_fleet_larger_than_the_scheduler_scores_in_full_the_requester_is_confined_to_nodes_with_room(
    h: Harness,
) -> None:
    """kube-scheduler looks at 100 feasible Nodes of a larger fleet: the spot's Node must be among them."""
    others = [f"node-{i:03}" for i in range(200)]
    h.put(*(named(node_obj(name)) for name in [NODE, *others]))
    h.put(gpu_map_obj({NODE: {GPU0: 0, GPU1: 1}} | {name: {f"GPU-{name}": 0} for name in others}))
    full = others[:60]  # a requester on each of these holds its only GPU
    h.put(*(requester_obj(name=f"on-{n}", uid=f"on-{n}", gpus=(f"GPU-{n}",)) | {"spec": {"nodeName": n}} for n in full))
    own = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["z"]}]}, {}]}
    zone_term = own["nodeSelectorTerms"][0]["matchExpressions"]
    pod = new_requester(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": own}})
    placed = patched(pod, await review(h, pod))
    assert preferred_nodes(placed) == [NODE]
    terms = required_terms(placed)
    assert [t["matchExpressions"][:-1] for t in terms] == [zone_term, []]  # each term of its own, narrowed
    (allowed,) = {tuple(t["matchExpressions"][-1]["values"]) for t in terms}
    assert {t["matchExpressions"][-1]["key"] for t in terms} == {keys.HOSTNAME_LABEL}
    assert len(allowed) == 100
    assert allowed[0] == f"host-{NODE}"
    assert not set(allowed) & {f"host-{n}" for n in full}
    decision = decided(placed)
    assert decision is not None
    assert decision.result is Result.PLACED_ON_SLEEPER


async def test_in_a_fleet_the_scheduler_scores_in_full_the_requester_may_go_anywhere(h: Harness) -> None:
    h.put(*(node_obj(f"node-{i:03}") for i in range(90)))
    pod = new_requester()
    placed = patched(pod, await review(h, pod))
    assert preferred_nodes(placed) == [NODE]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in placed["spec"]["affinity"]["nodeAffinity"]


async def test_kubectl_dualpods_status_counts_the_requesters_placed_on_a_sleeper_and_served_by_it(h: Harness) -> None:
    placed = []
    for uid in ("a", "b"):
        pod = new_requester()
        pod = patched(pod, await review(h, pod, uid)) | {"spec": {"nodeName": NODE}}
        pod["metadata"] |= {"name": f"req-{uid}", "uid": f"req-{uid}-uid"}
        placed.append(pod)
        h.controller.placement.reservations = Reservations()  # as if the first one had shown up
    plain = requester_obj(name="plain", uid="plain-uid")
    served = bound(launcher_obj(), placed[0])  # the first one woke the sleeper it was placed on
    status = fleet_status([served], [], [*placed, plain]).placement
    assert (status.decided, status.on_sleeper, status.hot) == (2, 2, 1)
    assert "hit ratio 50%" in as_table(fleet_status([served], [], [*placed, plain]), datetime.now(UTC))


def test_the_webhook_is_sent_only_the_requesters_that_opted_in() -> None:
    """The match condition the leader keeps on the webhook (the API server evaluates it: e2e/test_placement.py)."""
    values = {"on": keys.PLACEMENT_PREFER_SLEEPER, "off": keys.PLACEMENT_OFF, "typo": "nearby"}
    by_default_off = opted_in_expression(values, default_on=False)
    assert by_default_off.startswith("has(object.metadata.annotations) && (")
    assert by_default_off.endswith(' in ["on", "typo"])')  # a value that means nothing is sent, for its Event
    assert '!= "off"' in by_default_off  # the requester's own annotation first
    assert opted_in_expression(values, default_on=True).endswith(' in ["off"]))')


async def test_the_leader_keeps_the_charts_own_match_conditions_beside_its_own() -> None:
    async with client.ApiClient() as api:  # never connects
        registration = Registration(api, "cfg", "https://127.0.0.9:9443/placement", b"pem", lambda: "true")
    chart = {"name": "launcher-mode-requester", "expression": "has(object.metadata.annotations)"}
    stale = {"name": OPTED_IN_CONDITION, "expression": "false"}
    wanted = registration.wanted({"matchConditions": [chart, stale], "clientConfig": {"url": "https://127.0.0.1:1/"}})
    assert wanted["matchConditions"] == [chart, {"name": OPTED_IN_CONDITION, "expression": "true"}]
    assert wanted["clientConfig"]["url"] == "https://127.0.0.9:9443/placement"


async def test_a_launcher_promised_to_a_placed_requester_is_not_promised_again_for_its_other_gpu(h: Harness) -> None:
    """One launcher serves one requester: its sleeper on the other GPU must wait for another launcher."""
    other = inst(wanted_id(gpus=(GPU1,)), gpus=(GPU1,))
    launcher = summarized(launcher_obj(), inst(WANTED), other)
    h.put(launcher)
    h.views.put(launcher, inst(WANTED), other)
    pod = new_requester()
    placed = patched(pod, await review(h, pod, "a"))
    placed["metadata"] |= {"name": "req-1", "uid": "req-1-uid", "resourceVersion": "1"}
    h.put(placed)  # in the cache now, not scheduled yet: its promise is its own
    decision = decided(patched(pod, await review(h, pod, "b")))
    assert decision is not None
    assert decision.result is Result.NO_SLEEPER
