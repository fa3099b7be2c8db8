"""E22 sleeper-aware placement behind the real API server and kube-scheduler: the chart's webhook (its defaults:
installed, placement off unless a requester or its ISC opts in), the leading dual-pods controller serving it, stand-in
launchers on the session's 2 Nodes x 2 GPUs (device plugin). tests/test_placement.py has the decision's cases."""

import functools
import time

from kubernetes_asyncio import client

from api import keys
from controller import pods
from controller.dualpods.placement.choice import OPTED_IN_CONDITION, Result, decided
from e2e.actuation import release
from e2e.chart import DUAL_PODS
from e2e.dualpods_env import DualPodsEnv, Obj
from e2e.waiting import wait_for

PLACED = {keys.PLACEMENT_ANNOTATION: keys.PLACEMENT_PREFER_SLEEPER}
SCHEDULED_WITHIN_S = 10.0  # the bound for the stock path when placement is down


async def models(env: DualPodsEnv) -> None:
    """A LauncherConfig of stand-in launchers, one per GPU; ISC `placed` opts in, ISC `plain` says nothing."""
    await env.create_launcher_config("lc", max_instances=2, launcher_args=["--stand-in"])
    await env.create_population_policy("one-per-gpu", "lc", count=2)
    await env.create_isc("placed", "lc", port=8005, options="--model placed", isc_annotations=PLACED)
    await env.create_isc("plain", "lc", port=8006, options="--model plain")
    # The leader adds an ISC that opts in to the webhook's match condition when its informer sees it: a requester
    # created before that is created as written, unplaced (docs/operations.md#sleeper-aware-placement).
    await wait_for(functools.partial(_opted_in, env), what="the opt-in of ISC placed in the webhook", within=30)


async def _opted_in(env: DualPodsEnv) -> str:
    configurations = await client.AdmissionregistrationV1Api(env.api).list_mutating_webhook_configuration()
    for configuration in configurations.items:
        if configuration.metadata.name.startswith(f"{env.namespace}-"):
            for condition in configuration.webhooks[0].match_conditions or []:
                if condition.name == OPTED_IN_CONDITION and '"placed"' in condition.expression:
                    return str(condition.expression)
    return ""


def where(requester: Obj) -> tuple[str, str]:
    return requester["spec"]["nodeName"], pods.annotations(requester)[keys.ACCELERATORS_ANNOTATION]


async def events_of(env: DualPodsEnv, requester: Obj) -> list[tuple[str, str]]:
    listed = await env.core.list_namespaced_event(
        env.namespace, field_selector=f"involvedObject.uid={requester['metadata']['uid']}"
    )
    return [(e.reason, e.message) for e in listed.items]


async def test_an_opted_in_requester_lands_on_its_sleeper_and_starts_hot_a_plain_one_as_created(
    env: DualPodsEnv,
) -> None:
    await models(env)
    await env.create_requesters("placed", "placed")
    first = await env.ready_requester("placed")
    sleeper_at = where(first)
    launcher = await env.launcher_of(first)
    instance = pods.annotations(launcher)[keys.INSTANCE_ID_ANNOTATION]
    decision = decided(first)
    assert decision is not None
    assert decision.result is Result.NO_SLEEPER  # nothing asleep yet: placed by the scheduler as usual
    await release(env, "placed")

    await env.create_requesters("plain", "plain")
    plain = await env.ready_requester("plain")
    assert keys.PLACED_ANNOTATION not in pods.annotations(plain)
    assert "affinity" not in plain["spec"]  # exactly as its ReplicaSet wrote it
    await release(env, "plain")

    # The stock scheduler would pick this GPU one time in four (2 Nodes, and the kubelet's pick of 2 GPUs): three
    # swaps back in a row land there because they were placed there.
    for _ in range(3):
        await env.scale("placed", 1)
        requester = await env.ready_requester("placed")
        assert where(requester) == sleeper_at
        decision = decided(requester)
        assert decision is not None
        assert decision.result is Result.PLACED_ON_SLEEPER
        assert decision.spot is not None
        assert (decision.spot.node, ",".join(decision.spot.gpus)) == sleeper_at
        bound = await env.launcher_of(requester)
        assert (pods.name(bound), pods.annotations(bound)[keys.INSTANCE_ID_ANNOTATION]) == (
            pods.name(launcher),
            instance,
        )
        told = await wait_for(functools.partial(_told, env, requester), what="its Event", within=30)
        assert [reason for reason, _ in told].count("PlacedOnSleeper") == 1
        await release(env, "placed")
        await env.scale("plain", 1)  # other traffic in between, wherever the scheduler puts it
        await env.ready_requester("plain")
        await release(env, "plain")
    # The API server sends the webhook only requesters that opted in: the leader keeps that match condition.
    configurations = await client.AdmissionregistrationV1Api(env.api).list_mutating_webhook_configuration()
    (ours,) = [c for c in configurations.items if c.metadata.name.startswith(f"{env.namespace}-")]
    conditions = {c.name: c.expression for c in ours.webhooks[0].match_conditions}
    assert conditions[OPTED_IN_CONDITION].endswith(' in ["placed"])')
    metrics = await env.controllers.metrics()
    assert f'dualpods_placements_total{{exported_namespace="{env.namespace}",result="PlacedOnSleeper"}} 3.0' in metrics


async def _told(env: DualPodsEnv, requester: Obj) -> list[tuple[str, str]]:
    found = await events_of(env, requester)
    return found if any(reason == "PlacedOnSleeper" for reason, _ in found) else []


async def test_placement_keeps_the_requesters_own_constraints_and_is_not_needed_to_schedule(env: DualPodsEnv) -> None:
    await models(env)
    await env.create_requesters("placed", "placed")
    sleeper_node, _ = where(await env.ready_requester("placed"))
    await release(env, "placed")
    other = next(n.name for n in await env.cluster.kubelet.nodes() if n.name != sleeper_node)

    # Its own node selector names the other Node: it goes there, placed by the scheduler as usual.
    await env.create_requesters("elsewhere", "placed", node=other)
    elsewhere = await env.ready_requester("elsewhere")
    assert elsewhere["spec"]["nodeName"] == other
    assert elsewhere["spec"]["nodeSelector"] == {keys.HOSTNAME_LABEL: other}
    decision = decided(elsewhere)
    assert decision is not None
    assert decision.result is Result.NO_SLEEPER
    await release(env, "elsewhere")

    # Its own required node affinity names the other Node (where "elsewhere" left a sleeper): kept as written, and
    # it goes there.
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": keys.HOSTNAME_LABEL, "operator": "In", "values": [other]}]}]}}}  # fmt: skip
    await env.create_requesters("affine", "placed", replicas=0)
    await env.apps.patch_namespaced_replica_set(
        "affine", env.namespace, {"spec": {"template": {"spec": {"affinity": affinity}}}}
    )
    await env.scale("affine", 1)
    affine = await env.ready_requester("affine")
    assert affine["spec"]["nodeName"] == other
    required = "requiredDuringSchedulingIgnoredDuringExecution"
    assert affine["spec"]["affinity"]["nodeAffinity"][required] == affinity["nodeAffinity"][required]
    await release(env, "affine")

    # The placement component is gone (its controller scaled to 0): a new requester is created as it came and the
    # stock scheduler places it at once; it is served once the controller is back.
    apps = client.AppsV1Api(env.api)
    (deployment,) = (await apps.list_namespaced_deployment(
        env.namespace, label_selector=f"app.kubernetes.io/component={DUAL_PODS}")).items  # fmt: skip
    await apps.patch_namespaced_deployment_scale(deployment.metadata.name, env.namespace, {"spec": {"replicas": 0}})
    await wait_for(lambda: _none(env), what="the dual-pods controller gone", within=60)
    created = time.monotonic()
    await env.scale("placed", 1)

    async def scheduled() -> Obj:
        found = [p for p in await env.requesters("placed") if p["spec"].get("nodeName")]
        return found[0] if found else {}

    requester = await wait_for(scheduled, what="the requester scheduled", within=SCHEDULED_WITHIN_S, interval=0.1)
    assert time.monotonic() - created < SCHEDULED_WITHIN_S
    assert keys.PLACED_ANNOTATION not in pods.annotations(requester)
    assert "affinity" not in requester["spec"]
    await apps.patch_namespaced_deployment_scale(deployment.metadata.name, env.namespace, {"spec": {"replicas": 1}})
    await env.ready_requester("placed")


async def _none(env: DualPodsEnv) -> bool:
    """No dual-pods controller Pod at all, not even one terminating (which may still answer)."""
    listed = await env.core.list_namespaced_pod(
        env.namespace, label_selector=f"app.kubernetes.io/component={DUAL_PODS}"
    )
    return not listed.items
