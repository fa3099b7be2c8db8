"""The launcher populator against the loopback cluster's real API server, scheduler and kubelet.

The Populator runs in the test's event loop (the chart runs it as a Pod). Launchers that must become
Ready run the vLLM stand-in on the launcher port, which answers the `/health` readiness probe the
launcher template adds; launchers whose readiness does not matter use an unknown image (a pause
container: Running, never Ready).
"""

import asyncio
import contextlib
import functools
import re
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from api import keys
from api.crds import GROUP, VERSION, LauncherConfig, LauncherPopulationPolicy
from controller.endpoint import serve_metrics
from controller.launcher_template import launcher_config_hash
from controller.populator import PopulatorOptions, run_populator
from controller.populator.phases import LauncherPodPhase
from controller.populator.stuck import message as stuck_message
from e2e.cluster.cluster import LoopbackCluster, pod_is_ready
from e2e.cluster.ports import free_port
from e2e.crds import rules_lifted
from e2e.waiting import wait_for

GPU_NODES = {"nvidia.com/gpu.present": "true"}
STANDIN = {
    "name": keys.INFERENCE_SERVER_CONTAINER,
    "image": "python:3.11-slim",
    "command": ["python3", "-m", "standin", "--host", "$(POD_IP)", "--port", str(keys.LAUNCHER_PORT)],
    "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
}
PAUSE = {"name": keys.INFERENCE_SERVER_CONTAINER, "image": "registry.example/launcher:v1"}
# What a test waits for before it checks that nothing more happens.
QUIET_S = 2.0


def launcher_config(name: str, container: dict[str, Any], **spec: Any) -> dict[str, Any]:
    labels = spec.pop("labels", {"team": "populator-test"})
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LauncherConfig",
        "metadata": {"name": name},
        "spec": {
            "maxInstances": 2,
            "podTemplate": {
                "metadata": {"labels": labels, "annotations": {"from-launcher-config": "yes"}},
                "spec": {"containers": [container], "terminationGracePeriodSeconds": 2, **spec},
            },
        },
    }


def policy(name: str, counts: dict[str, int], match_labels: dict[str, str] = GPU_NODES) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LauncherPopulationPolicy",
        "metadata": {"name": name},
        "spec": {
            "enhancedNodeSelector": {"labelSelector": {"matchLabels": match_labels}},
            "countForLauncher": [{"launcherConfigName": lc, "launcherCount": n} for lc, n in counts.items()],
        },
    }


class Objects:
    """Our custom objects in the test's namespace."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self._custom = client.CustomObjectsApi(api)
        self._namespace = namespace

    async def create(self, manifest: dict[str, Any]) -> None:
        plural = _plural(manifest["kind"])
        await self._custom.create_namespaced_custom_object(GROUP, VERSION, self._namespace, plural, manifest)

    async def get(self, kind: str, name: str) -> dict[str, Any]:
        got: dict[str, Any] = await self._custom.get_namespaced_custom_object(
            GROUP, VERSION, self._namespace, _plural(kind), name
        )
        return got

    async def patch(self, kind: str, name: str, patch: dict[str, Any]) -> None:
        await self._custom.patch_namespaced_custom_object(
            GROUP, VERSION, self._namespace, _plural(kind), name, patch, _content_type="application/merge-patch+json"
        )

    async def set_count(self, name: str, counts: dict[str, int]) -> None:
        items = [{"launcherConfigName": lc, "launcherCount": n} for lc, n in counts.items()]
        await self.patch("LauncherPopulationPolicy", name, {"spec": {"countForLauncher": items}})

    async def errors(self, kind: str, name: str) -> list[str] | None:
        """The status errors once the controller has observed the current generation, else None."""
        obj = await self.get(kind, name)
        status = obj.get("status") or {}
        if status.get("observedGeneration") != obj["metadata"]["generation"]:
            return None
        errors: list[str] = status.get("errors") or []
        return errors

    async def message(self, kind: str, name: str, type_: str) -> str:
        """The condition's message as the object shows it now."""
        shown = await self.get(kind, name)
        (found,) = [c for c in shown["status"]["conditions"] if c["type"] == type_]
        return str(found.get("message", ""))

    async def condition(self, kind: str, name: str, type_: str) -> tuple[str, str] | None:
        """The condition's status and reason once the controller has observed the current generation."""
        obj = await self.get(kind, name)
        status = obj.get("status") or {}
        if status.get("observedGeneration") != obj["metadata"]["generation"]:
            return None
        found = next((c for c in status.get("conditions") or [] if c["type"] == type_), None)
        return (found["status"], found["reason"]) if found else None


def _plural(kind: str) -> str:
    return {"LauncherConfig": LauncherConfig.RESOURCE, "LauncherPopulationPolicy": LauncherPopulationPolicy.RESOURCE}[
        kind
    ].plural


@contextlib.asynccontextmanager
async def populator(api: client.ApiClient, namespace: str, **options: Any) -> AsyncIterator[CollectorRegistry]:
    """A Populator running in this event loop; fails the test if it stopped by itself."""
    registry = CollectorRegistry()
    running = asyncio.ensure_future(run_populator(api, namespace, PopulatorOptions(**options), registry))
    try:
        yield registry
        assert not running.done(), f"the populator stopped: {running.exception()!r}"
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


async def launchers(api: client.ApiClient, namespace: str) -> list[client.V1Pod]:
    selector = f"{keys.COMPONENT_LABEL}={keys.LAUNCHER_COMPONENT}"
    pods: list[client.V1Pod] = (
        await client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector)
    ).items
    return pods


def per_node(pods: list[client.V1Pod]) -> Counter[str]:
    return Counter(pod.metadata.labels[keys.NODE_NAME_LABEL] for pod in pods)


async def gpu_nodes(api: client.ApiClient) -> list[str]:
    nodes = await client.CoreV1Api(api).list_node(label_selector="nvidia.com/gpu.present=true")
    return sorted(node.metadata.name for node in nodes.items)


async def settled(
    api: client.ApiClient, namespace: str, expected: dict[str, int], *, ready: bool = False
) -> list[client.V1Pod]:
    """Wait until the launchers are exactly `expected` per node, none deleting (and all Ready)."""

    async def check() -> list[client.V1Pod] | None:
        pods = await launchers(api, namespace)
        if any(p.metadata.deletion_timestamp for p in pods) or per_node(pods) != Counter(expected):
            return None
        return pods if not ready or all(map(pod_is_ready, pods)) else None

    pods: list[client.V1Pod] | None = await wait_for(check, what=f"launchers per node {expected}", within=60)
    assert pods is not None
    return pods


async def pod_count_metric(port: int, config: str) -> dict[str, float]:
    """`fma_launcher_pod_count` of one LauncherConfig as the metrics endpoint serves it, by phase."""
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    pattern = rf'^fma_launcher_pod_count\{{lcfg_name="{re.escape(config)}",phase="(\w+)"\}} (\S+)$'
    return {m[1]: float(m[2]) for m in re.finditer(pattern, text, re.MULTILINE)}


async def eventually(check: Callable[[], Awaitable[Any]], expected: Any, what: str, within: float = 30) -> None:
    """Wait until `check()` returns `expected`; the timeout names the last value seen."""
    seen: list[Any] = []

    async def equal() -> bool:
        seen[:] = [await check()]
        return bool(seen[0] == expected)

    try:
        await wait_for(equal, what=f"{what} to be {expected!r}", within=within)
    except TimeoutError as error:
        raise AssertionError(f"{error}; it was {seen[0] if seen else None!r}") from None


def phases(**counts: float) -> dict[str, float]:
    return {"bound": 0, "unbound": 0, "stuck_scheduling": 0, "stuck_starting": 0, "stale": 0, **counts}


@pytest.mark.usefixtures("crds")
async def test_every_selected_node_gets_its_launchers_and_follows_the_count(
    api: client.ApiClient, namespace: str
) -> None:
    objects = Objects(api, namespace)
    nodes = await gpu_nodes(api)
    port = free_port()
    async with populator(api, namespace) as registry, serve_metrics(registry, "127.0.0.1", port):
        await objects.create(launcher_config("standin", STANDIN))
        await objects.create(policy("gpus", {"standin": 2}))
        pods = await settled(api, namespace, dict.fromkeys(nodes, 2), ready=True)

        config = await objects.get("LauncherConfig", "standin")
        template_hash = pods[0].metadata.annotations[keys.LAUNCHER_TEMPLATE_HASH_ANNOTATION]
        for pod in pods:
            node = pod.metadata.labels[keys.NODE_NAME_LABEL]
            assert pod.spec.node_name == node
            assert pod.spec.node_selector == {"kubernetes.io/hostname": node}
            assert pod.metadata.generate_name == "launcher-standin-"
            assert pod.metadata.labels == {
                "team": "populator-test",
                keys.COMPONENT_LABEL: keys.LAUNCHER_COMPONENT,
                keys.LAUNCHER_CONFIG_NAME_LABEL: "standin",
                keys.SLEEPING_LABEL: "true",
                keys.NODE_NAME_LABEL: node,
            }
            assert pod.metadata.annotations == {
                "from-launcher-config": "yes",
                keys.LAUNCHER_TEMPLATE_HASH_ANNOTATION: template_hash,
                keys.LAUNCHER_CONFIG_HASH_ANNOTATION: launcher_config_hash(template_hash, node),
            }
            [owner] = pod.metadata.owner_references
            assert (owner.kind, owner.name, owner.uid) == ("LauncherConfig", "standin", config["metadata"]["uid"])
        await eventually(lambda: objects.errors("LauncherConfig", "standin"), [], "the LC status errors")
        await eventually(lambda: objects.errors("LauncherPopulationPolicy", "gpus"), [], "the LPP status errors")
        ready = functools.partial(objects.condition, type_="Ready")
        await eventually(lambda: ready("LauncherConfig", "standin"), ("True", "Valid"), "the LC Ready")
        await eventually(lambda: ready("LauncherPopulationPolicy", "gpus"), ("True", "Populated"), "the LPP Ready")
        metric = functools.partial(pod_count_metric, port, "standin")
        await eventually(metric, phases(unbound=2 * len(nodes)), "the launcher count")

        await objects.set_count("gpus", {"standin": 1})
        survivors = await settled(api, namespace, dict.fromkeys(nodes, 1))
        assert {p.metadata.uid for p in survivors} < {p.metadata.uid for p in pods}, "no launcher is replaced"
        await eventually(metric, phases(unbound=len(nodes)), "the launcher count")


@pytest.mark.usefixtures("crds")
async def test_a_template_change_replaces_unbound_launchers_and_bound_ones_are_never_deleted(
    api: client.ApiClient, namespace: str
) -> None:
    objects = Objects(api, namespace)
    core = client.CoreV1Api(api)
    first, *others = await gpu_nodes(api)
    async with populator(api, namespace):
        await objects.create(launcher_config("standin", STANDIN))
        await objects.create(policy("gpus", {"standin": 1}))
        before = await settled(api, namespace, dict.fromkeys([first, *others], 1), ready=True)
        bound = next(p for p in before if p.spec.node_name == first)
        annotation = {keys.REQUESTER_ANNOTATION: "0a1b2c3d-uid requester-0"}
        await core.patch_namespaced_pod(bound.metadata.name, namespace, {"metadata": {"annotations": annotation}})

        await objects.patch(
            "LauncherConfig", "standin", {"spec": {"podTemplate": {"metadata": {"labels": {"rev": "2"}}}}}
        )
        after = await wait_for(
            lambda: _replaced(api, namespace, before, keep=bound.metadata.uid), what="unbound launchers replaced"
        )
        assert per_node(after) == Counter(dict.fromkeys([first, *others], 1)), "the bound launcher counts"
        for pod in after:
            assert (pod.metadata.labels.get("rev") == "2") is (pod.metadata.uid != bound.metadata.uid)

        await objects.set_count("gpus", {"standin": 0})
        [kept] = await settled(api, namespace, {first: 1})
        assert kept.metadata.uid == bound.metadata.uid
        await asyncio.sleep(QUIET_S)
        assert [p.metadata.uid for p in await launchers(api, namespace)] == [bound.metadata.uid]


@pytest.mark.usefixtures("crds")
async def test_a_cordoned_node_keeps_its_launchers_gets_no_new_one_and_does_not_hold_the_policy_back(
    api: client.ApiClient, namespace: str
) -> None:
    objects = Objects(api, namespace)
    core = client.CoreV1Api(api)
    nodes = await gpu_nodes(api)
    first, *others = nodes
    ready = functools.partial(objects.condition, type_="Ready")
    async with populator(api, namespace):
        await objects.create(launcher_config("standin", STANDIN))
        await objects.create(policy("gpus", {"standin": 1}))
        [kept] = [p for p in await settled(api, namespace, dict.fromkeys(nodes, 1)) if p.spec.node_name == first]
        await core.patch_node(first, {"spec": {"unschedulable": True}})
        try:
            await objects.set_count("gpus", {"standin": 2})
            await settled(api, namespace, {first: 1, **dict.fromkeys(others, 2)}, ready=True)
            await eventually(lambda: ready("LauncherPopulationPolicy", "gpus"), ("True", "Populated"), "the LPP Ready")
            await asyncio.sleep(QUIET_S)
            on_first = [p for p in await launchers(api, namespace) if p.spec.node_name == first]
            assert [p.metadata.uid for p in on_first] == [kept.metadata.uid], "kept, and none made beside it"
        finally:
            await core.patch_node(first, {"spec": {"unschedulable": False}})
        await settled(api, namespace, dict.fromkeys(nodes, 2), ready=True)


async def _replaced(
    api: client.ApiClient, namespace: str, before: list[client.V1Pod], keep: str
) -> list[client.V1Pod] | None:
    pods = await launchers(api, namespace)
    old = {p.metadata.uid for p in before}
    fresh = [p for p in pods if p.metadata.uid not in old]
    done = (
        len(fresh) == len(before) - 1
        and all(map(pod_is_ready, fresh))
        and not any(p.metadata.deletion_timestamp for p in pods)
    )
    return pods if done and keep in {p.metadata.uid for p in pods} else None


@pytest.mark.usefixtures("crds")
async def test_without_its_launcher_config_the_populator_keeps_hands_off(api: client.ApiClient, namespace: str) -> None:
    objects = Objects(api, namespace)
    nodes = await gpu_nodes(api)
    port = free_port()
    async with populator(api, namespace) as registry, serve_metrics(registry, "127.0.0.1", port):
        await objects.create(launcher_config("paused", PAUSE))
        await objects.create(policy("gpus", {"paused": 1}))
        before = await settled(api, namespace, dict.fromkeys(nodes, 1))

        # Orphan: otherwise the garbage collector deletes the launchers the LauncherConfig owns.
        await client.CustomObjectsApi(api).delete_namespaced_custom_object(
            GROUP, VERSION, namespace, "launcherconfigs", "paused", propagation_policy="Orphan"
        )
        missing = 'LauncherConfig "paused" referenced in CountForLauncher does not exist'
        await eventually(lambda: objects.errors("LauncherPopulationPolicy", "gpus"), [missing], "the LPP errors")
        await objects.set_count("gpus", {"paused": 2})
        await eventually(lambda: objects.errors("LauncherPopulationPolicy", "gpus"), [missing], "the LPP errors")
        await asyncio.sleep(QUIET_S)
        after = await launchers(api, namespace)
        assert sorted(p.metadata.uid for p in after) == sorted(p.metadata.uid for p in before)
        assert not any(p.metadata.deletion_timestamp for p in after)
        # Without their LauncherConfig, the launchers count as stale.
        await eventually(lambda: pod_count_metric(port, "paused"), phases(stale=len(nodes)), "the launcher count")


@pytest.mark.usefixtures("crds")
async def test_status_reports_missing_malformed_and_unparseable_references(
    cluster: LoopbackCluster, api: client.ApiClient, namespace: str
) -> None:
    objects = Objects(api, namespace)
    nodes = await gpu_nodes(api)
    async with populator(api, namespace):
        # The API server refuses a template without the launcher's container (the CRD's validation rule); one
        # stored before the rule existed (ratcheting keeps it updatable) is what the populator reports below.
        broken = launcher_config("broken", {**PAUSE, "name": "not-the-launcher"})
        with pytest.raises(ApiException) as refused:
            await objects.create(broken)
        assert "spec.podTemplate.spec.containers: Required value" in str(refused.value.body)
        async with rules_lifted(cluster, api, LauncherConfig):
            await objects.create(broken)
        await objects.create(policy("gpus", {"ghost": 1, "broken": 1}))
        bad_selector = policy("bad-selector", {"broken": 1})
        bad_selector["spec"]["enhancedNodeSelector"]["labelSelector"] = {
            "matchExpressions": [{"key": "zone", "operator": "Sometimes", "values": ["a"]}]
        }
        await objects.create(bad_selector)

        template_error = "LauncherConfig broken: podTemplate.spec has no container named 'inference-server'"
        ghost = 'LauncherConfig "ghost" referenced in CountForLauncher does not exist'
        malformed = f'LauncherConfig "broken" referenced in CountForLauncher is malformed: {template_error}'
        await eventually(lambda: objects.errors("LauncherConfig", "broken"), [template_error], "the LC errors")
        await eventually(lambda: objects.errors("LauncherPopulationPolicy", "gpus"), [ghost, malformed], "LPP errors")
        stalled = functools.partial(objects.condition, type_="Stalled")
        await eventually(lambda: stalled("LauncherConfig", "broken"), ("True", "TemplateError"), "the LC Stalled")
        await eventually(
            lambda: stalled("LauncherPopulationPolicy", "gpus"), ("True", "LauncherConfigNotFound"), "the LPP Stalled"
        )
        await eventually(
            lambda: stalled("LauncherPopulationPolicy", "bad-selector"), ("True", "InvalidSpec"), "the LPP Stalled"
        )
        errors = await wait_for(lambda: objects.errors("LauncherPopulationPolicy", "bad-selector"), what="LPP errors")
        assert errors is not None
        assert errors[0].startswith("invalid enhancedNodeSelector: labelSelector.matchExpressions.0.operator"), errors
        await asyncio.sleep(QUIET_S)
        assert await launchers(api, namespace) == [], "hands-off while the LauncherConfig is malformed"

        fixed = {"spec": {"podTemplate": {"spec": {"containers": [PAUSE]}}}}
        await objects.patch("LauncherConfig", "broken", fixed)
        await eventually(lambda: objects.errors("LauncherConfig", "broken"), [], "the LC errors")
        await eventually(lambda: objects.errors("LauncherPopulationPolicy", "gpus"), [ghost], "the LPP errors")
        await settled(api, namespace, dict.fromkeys(nodes, 1))


@pytest.mark.usefixtures("crds")
async def test_stuck_launchers_are_labelled_and_reported_once(api: client.ApiClient, namespace: str) -> None:
    objects = Objects(api, namespace)
    core = client.CoreV1Api(api)
    first = (await gpu_nodes(api))[0]
    async with populator(api, namespace, stuck_scheduling_threshold=1.0, stuck_starting_threshold=3.0):
        # Nothing matches its nodeSelector: never scheduled. A pause container is never Ready.
        await objects.create(launcher_config("unschedulable", PAUSE, nodeSelector={"dualpods.test/nowhere": "x"}))
        await objects.create(launcher_config("never-ready", PAUSE))
        await objects.create(
            policy("one-node", {"unschedulable": 1, "never-ready": 1}, {"kubernetes.io/hostname": first})
        )

        async def stuck_launchers() -> dict[str, client.V1Pod] | None:
            pods = await launchers(api, namespace)
            stuck = {p.metadata.labels[keys.LAUNCHER_CONFIG_NAME_LABEL]: p for p in pods}
            labelled = all(p.metadata.labels.get(keys.LAUNCHER_STUCK_LABEL) == "true" for p in pods)
            return stuck if len(stuck) == 2 and labelled else None

        stuck = await wait_for(stuck_launchers, what="both launchers labelled stuck", within=30)
        ready = functools.partial(objects.condition, type_="Ready")
        await eventually(lambda: ready("LauncherPopulationPolicy", "one-node"), ("False", "Unschedulable"), "Ready")
        message = await objects.message("LauncherPopulationPolicy", "one-node", "Ready")
        unschedulable = stuck["unschedulable"].metadata.name
        assert f"; unschedulable: {unschedulable} (0/" in message, "the scheduler's own words"
        await asyncio.sleep(QUIET_S)
        # One Event per stuck phase a launcher enters, however often the populator looks at it. On a loaded machine
        # the never-ready launcher may also wait past the scheduling threshold (1 s) before the scheduler places
        # it: a stuck_scheduling Event of its own, its label removed once it is placed, then stuck_starting.
        allowed = {
            "unschedulable": {LauncherPodPhase.STUCK_SCHEDULING},
            "never-ready": {LauncherPodPhase.STUCK_SCHEDULING, LauncherPodPhase.STUCK_STARTING},
        }
        for config, phase in (
            ("unschedulable", LauncherPodPhase.STUCK_SCHEDULING),
            ("never-ready", LauncherPodPhase.STUCK_STARTING),
        ):
            pod = stuck[config]
            events = await core.list_namespaced_event(
                namespace, field_selector=f"involvedObject.name={pod.metadata.name},reason=LauncherStuck"
            )
            seen = Counter((e.type, e.source.component, e.involved_object.uid, e.message) for e in events.items)
            expected = ("Warning", "launcher-populator", pod.metadata.uid, stuck_message(phase))
            assert seen[expected] == 1, f"one Event on entering {phase}: {seen}"
            assert all(e.count == 1 for e in events.items), f"never repeated: {seen}"
            assert {m for _, _, _, m in seen} <= {stuck_message(p) for p in allowed[config]}, seen
            assert sum(seen.values()) == len(seen), f"one Event per phase entered: {seen}"
        assert {p.metadata.uid for p in await launchers(api, namespace)} == {p.metadata.uid for p in stuck.values()}, (
            "stuck launchers are not replaced"
        )


@pytest.mark.usefixtures("crds")
async def test_launchers_a_quota_refuses_are_reported_on_the_policy_until_it_allows_them(
    api: client.ApiClient, namespace: str
) -> None:
    objects = Objects(api, namespace)
    core = client.CoreV1Api(api)
    nodes = await gpu_nodes(api)
    quota = {"metadata": {"name": "launchers"}, "spec": {"hard": {"pods": "1"}}}
    await core.create_namespaced_resource_quota(namespace, quota)

    async def quota_counted() -> bool:  # until then the API server refuses every Pod ("status unknown")
        found = await core.read_namespaced_resource_quota("launchers", namespace)
        return bool(found.status and found.status.hard)

    await wait_for(quota_counted, what="the quota's status", within=30)
    ready = functools.partial(objects.condition, type_="Ready")
    async with populator(api, namespace):
        await objects.create(launcher_config("pause", PAUSE))
        await objects.create(policy("gpus", {"pause": 1}))
        await eventually(lambda: ready("LauncherPopulationPolicy", "gpus"), ("False", "QuotaExceeded"), "LPP Ready")
        message = await objects.message("LauncherPopulationPolicy", "gpus", "Ready")
        assert message.startswith("0 of 2 launchers Ready; refused on node "), message
        assert "exceeded quota: launchers, requested: pods=1, used: pods=1, limited: pods=1" in message
        (created,) = await launchers(api, namespace)
        refused_node = next(node for node in nodes if node != created.metadata.labels[keys.NODE_NAME_LABEL])
        await asyncio.sleep(QUIET_S)  # the populator retries meanwhile; the Event is not repeated
        events = await core.list_namespaced_event(namespace, field_selector="involvedObject.name=gpus")
        assert [(e.type, e.reason, e.source.component, e.involved_object.kind, e.count) for e in events.items] == [
            ("Warning", "QuotaExceeded", "launcher-populator", "LauncherPopulationPolicy", 1)
        ]
        assert events.items[0].message.startswith(
            f"cannot create a launcher of LauncherConfig pause on node {refused_node}: "
        ), events.items[0].message

        await core.patch_namespaced_resource_quota("launchers", namespace, {"spec": {"hard": {"pods": "2"}}})
        await settled(api, namespace, dict.fromkeys(nodes, 1))
        # The pause launchers are never Ready: populating, and no longer for want of quota.
        await eventually(lambda: ready("LauncherPopulationPolicy", "gpus"), ("False", "Populating"), "LPP Ready")
