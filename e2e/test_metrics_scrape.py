"""Metrics arrive under the chart's default values (issue 25): with the chart's ServiceMonitor, PodMonitors,
PrometheusRule and dashboard on and every other value at its default, a requester is served, released (its instance
sleeps) and served again (a wake). Then every target the monitors define — read back from the API server, resolved
against the real Pods as Prometheus's service discovery would — is admitted by the NetworkPolicies to a Pod of the
`monitoring` namespace (their selectors evaluated against the Pods' and the namespace's real labels: no CNI enforces
them here), answers its scrape over HTTP with Prometheus text, and every dashboard panel's query finds its series.

No Prometheus Operator runs here: its three kinds are installed as schemaless CRDs, so the API server keeps the
chart's objects as rendered."""

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from e2e.cluster.cluster import LoopbackCluster
from e2e.dualpods_env import DualPodsEnv, installed
from e2e.monitoring import (
    Scraper,
    Target,
    admits,
    dashboard_queries,
    metric_names,
    pod_monitor_targets,
    series_names,
    service_monitor_targets,
)
from e2e.waiting import wait_for

Obj = dict[str, Any]
MONITORING = "monitoring"  # the namespace networkPolicy.monitoring admits by default
GROUP, VERSION = "monitoring.coreos.com", "v1"
OPERATOR_KINDS = {"ServiceMonitor": "servicemonitors", "PodMonitor": "podmonitors", "PrometheusRule": "prometheusrules"}
MONITORS_ON = [
    "serviceMonitor.enabled=true",
    "podMonitors.enabled=true",
    "prometheusRule.enabled=true",
    "grafanaDashboard.enabled=true",
]
# A Prometheus of the Prometheus Operator, as it labels its Pods.
PROMETHEUS_LABELS = {"app.kubernetes.io/name": "prometheus", "prometheus": "k8s"}
RS = "requesters"


async def install_operator_crds(api: client.ApiClient) -> None:
    """The Prometheus Operator's three kinds, any spec kept (idempotent: CRDs are cluster-wide)."""
    extensions = client.ApiextensionsV1Api(api)
    for kind, plural in OPERATOR_KINDS.items():
        schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
        body = {
            "metadata": {"name": f"{plural}.{GROUP}"},
            "spec": {
                "group": GROUP,
                "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
                "versions": [{"name": VERSION, "served": True, "storage": True, "schema": schema}],
            },
        }
        with contextlib.suppress(ApiException):  # made by an earlier run on this cluster
            await extensions.create_custom_resource_definition(body)

    async def established() -> bool:
        for plural in OPERATOR_KINDS.values():
            crd = await extensions.read_custom_resource_definition(f"{plural}.{GROUP}")
            if not any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or []):
                return False
        return True

    await wait_for(established, what="the Prometheus Operator's CRDs Established", within=30)


@contextlib.asynccontextmanager
async def monitoring_namespace(api: client.ApiClient) -> AsyncIterator[dict[str, str]]:
    """The `monitoring` namespace (made if absent, deleted afterwards if made here); its labels as the API server
    keeps them (`kubernetes.io/metadata.name` included)."""
    core = client.CoreV1Api(api)
    made = False
    try:
        found = await core.read_namespace(MONITORING)
    except ApiException as err:
        if err.status != 404:
            raise
        found = await core.create_namespace({"metadata": {"name": MONITORING}})
        made = True
    try:
        yield dict(found.metadata.labels or {})
    finally:
        if made:
            await core.delete_namespace(MONITORING)


async def serve_sleep_and_wake(env: DualPodsEnv) -> None:
    """A requester served cold (the dual-pods controller creates its launcher), released (its instance sleeps on the
    launcher, which a population policy then keeps), and served again hot; and a model that declares a warm pool
    (on Nodes that do not exist: it makes no copy to disturb the rest): every panel's series."""
    await env.create_launcher_config("lc", max_instances=2, launcher_args=["--stand-in"])
    await env.create_isc("isc", "lc", port=8005, options="--model a")
    nowhere = {"sleepers": 1, "nodeSelector": {"matchLabels": {"example.com/pool": "none"}}}
    await env.create_isc("pooled", "lc", port=8006, options="--model b", warm_pool=nowhere)
    node = (await env.cluster.kubelet.nodes())[0]
    await env.create_requesters(RS, "isc", node=node.name, gpu=sorted(node.gpus)[0])
    await env.ready_requester(RS)
    # The launcher outlives its requester. Only on its Node: a launcher the policy made elsewhere would still be
    # preloading when its target is scraped (refused: it failed a CI run so).
    only_there = {"labelSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}}}
    await env.create_population_policy("keep-one", "lc", count=1, selector=only_there)
    await env.scale(RS, 0)
    await env.wait_gone(RS)
    await env.wait_launchers_unbound(within=60)
    await env.scale(RS, 1)
    await env.ready_requester(RS)


async def operator_objects(env: DualPodsEnv, kind: str) -> list[Obj]:
    listed = await env.objects.list_namespaced_custom_object(GROUP, VERSION, env.namespace, OPERATOR_KINDS[kind])
    items: list[Obj] = listed["items"]
    return items


async def scrape_targets(env: DualPodsEnv, pods: list[Obj]) -> set[Target]:
    """Every target of the release's ServiceMonitor and PodMonitors, as the API server holds them."""
    services = env.api.sanitize_for_serialization((await env.core.list_namespaced_service(env.namespace)).items)
    found: set[Target] = set()
    for monitor in await operator_objects(env, "ServiceMonitor"):
        found |= service_monitor_targets(monitor, services, pods)
    for monitor in await operator_objects(env, "PodMonitor"):
        found |= pod_monitor_targets(monitor, pods)
    return found


async def scrape(http: aiohttp.ClientSession, target: Target) -> set[str]:
    """GET the target's metrics path as Prometheus does; the series names of its answer."""
    assert target.address.startswith("127."), f"{target}: a loopback address only"
    headers = {"Accept": "text/plain;version=0.0.4"}
    async with http.get(target.url, headers=headers, timeout=aiohttp.ClientTimeout(total=10)) as response:
        text = await response.text()
        assert response.status == 200, f"{target.url}: {response.status} {text[:200]}"
    names = series_names(text)
    assert names, f"{target.url}: no series"
    return names


async def test_every_target_is_admitted_and_scraped_and_every_dashboard_query_finds_series(
    cluster: LoopbackCluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    await install_operator_crds(api)
    async with monitoring_namespace(api) as monitoring_labels, installed(
        cluster, api, namespace, tmp_path, *MONITORS_ON
    ) as env:  # fmt: skip
        await serve_sleep_and_wake(env)
        pods = [p for p in await env.pods() if not p["metadata"].get("deletionTimestamp")]
        targets = await scrape_targets(env, pods)
        by_kind = {t.label("dualpods_target") for t in targets}
        assert by_kind == {"controller", "launcher", "instance", "requester"}, targets
        assert len([t for t in targets if t.label("dualpods_target") == "controller"]) == 2, "both controllers"

        policies = env.api.sanitize_for_serialization(
            (await client.NetworkingV1Api(api).list_namespaced_network_policy(namespace)).items
        )
        assert policies, "the default values render the NetworkPolicies"
        prometheus = Scraper(MONITORING, monitoring_labels, PROMETHEUS_LABELS)
        by_name = {p["metadata"]["name"]: p for p in pods}
        scraped: set[str] = set()
        async with aiohttp.ClientSession() as http:
            for target in sorted(targets, key=lambda t: t.url):
                assert admits(policies, by_name[target.pod], target.port, prometheus), f"{target}: refused by policy"
                scraped |= await scrape(http, target)

        configmaps = (await env.core.list_namespaced_config_map(namespace)).items
        (configmap,) = [c for c in configmaps if c.metadata.name.endswith("-dashboard")]
        missing = {
            f"{title}: {query}": sorted(metric_names(query) - scraped)
            for title, queries in dashboard_queries(json.loads(configmap.data["dualpods.json"])).items()
            for query in queries
            if metric_names(query) - scraped
        }
        assert not missing, missing
        assert await operator_objects(env, "PrometheusRule"), "the alert rules are installed"
