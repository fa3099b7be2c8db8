"""The chart's monitoring (issue 25): the alert rules load in a rule checker (their PromQL parsed by promql-parser, the
rule file's shape as Prometheus wants it) and read only metrics a component exports; the dashboard's queries do too
and select its namespace and release; the PodMonitors find launchers, serving instances and requesters on their
metrics ports; the NetworkPolicies admit the monitoring namespace to exactly those ports."""

import json
from datetime import timedelta
from typing import Any

import promql_parser
import pytest
from prometheus_client import CollectorRegistry

from api.vllm_surface.gauges import export_engine_gauges
from e2e.monitoring import Scraper, Target, admits, dashboard_queries, metric_names, pod_monitor_targets
from scripts.helm_chart import render_chart
from tests.test_metrics_documented import exported

Obj = dict[str, Any]
NS = "models"
MONITORS_ON = ["serviceMonitor.enabled=true", "podMonitors.enabled=true", "prometheusRule.enabled=true"]
SEVERITIES = {"critical", "warning"}
# Series Prometheus makes itself, for every target.
SYNTHETIC = {"up"}
PROMETHEUS = Scraper("monitoring", {"kubernetes.io/metadata.name": "monitoring"}, {"app.kubernetes.io/name": "p"})


def render(*settings: str) -> list[Obj]:
    return render_chart("rel", NS, *settings)


def of_kind(docs: list[Obj], kind: str) -> list[Obj]:
    return [d for d in docs if d["kind"] == kind]


def known_series() -> set[str]:
    """Every series name a component can export: counters' `_total`, histograms' `_bucket`, `_sum`, `_count`, and
    the model servers' vLLM engine gauges (every runtime exports them under vLLM's names)."""
    names = set(SYNTHETIC)
    for name in exported():
        names |= {name, f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    engine = CollectorRegistry()
    export_engine_gauges(engine, "model", int, int, lambda: None)
    return names | {family.name for family in engine.collect()}


def rules() -> list[Obj]:
    (rule,) = of_kind(render(*MONITORS_ON), "PrometheusRule")
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def test_the_alert_rules_load_in_a_rule_checker() -> None:
    (rule,) = of_kind(render(*MONITORS_ON), "PrometheusRule")
    groups = rule["spec"]["groups"]
    assert len({g["name"] for g in groups}) == len(groups), "group names are unique"
    for each in (r for g in groups for r in g["rules"]):
        assert set(each) <= {"alert", "expr", "for", "labels", "annotations"}, each
        promql_parser.parse(each["expr"])  # raises on an expression Prometheus would refuse
        if "for" in each:
            assert promql_parser.parse_duration(each["for"]) >= timedelta(minutes=1), each
        assert each["labels"]["severity"] in SEVERITIES, each
        assert {"summary", "description"} <= set(each["annotations"]), each
        assert 'dualpods_release="rel"' in each["expr"], "only this release's series"


def test_the_alerts_cover_what_a_platform_team_pages_on_with_real_metric_names() -> None:
    read = {r["alert"]: metric_names(r["expr"]) for r in rules()}
    assert read == {
        "DualPodsRequesterNotServed": {"dualpods_requester_ready"},
        "DualPodsLaunchersStuck": {"fma_launcher_pod_count"},
        "DualPodsLauncherDown": {"up"},
        "DualPodsWakeCheckFailures": {"dualpods_wake_check_failures_total"},
        "DualPodsSleeperBudgetRefusesWakes": {"dualpods_sleeper_budget_actions_total"},
        "DualPodsActuationSlow": {"fma_actuation_seconds_bucket"},
    }
    assert set().union(*read.values()) <= known_series()
    paths = [r["labels"]["path"] for r in rules() if r["alert"] == "DualPodsActuationSlow"]
    assert paths == ["cold", "warm", "hot"]


def test_the_alert_thresholds_are_values() -> None:
    settings = [*MONITORS_ON, "prometheusRule.actuationP99Seconds.hot=12", "prometheusRule.requesterNotServedFor=1h"]
    (rule,) = of_kind(render(*settings), "PrometheusRule")
    by_name = {(r["alert"], r["labels"].get("path")): r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert by_name[("DualPodsActuationSlow", "hot")]["expr"].endswith("> 12")
    assert by_name[("DualPodsRequesterNotServed", None)]["for"] == "1h"


def test_every_dashboard_query_parses_selects_namespace_and_release_and_reads_exported_series() -> None:
    (configmap,) = [d for d in of_kind(render("grafanaDashboard.enabled=true"), "ConfigMap") if "dashboard" in
                    d["metadata"]["name"]]  # fmt: skip
    dashboard = json.loads(configmap["data"]["dualpods.json"])
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"namespace", "release"} <= variables
    for title, queries in dashboard_queries(dashboard).items():
        for query in queries:
            names = metric_names(query)
            assert names <= known_series(), f"{title}: {sorted(names - known_series())} exported by nothing"
            selectors = query.count("{")
            assert query.count('namespace=~"$namespace", dualpods_release=~"$release"') == selectors, (title, query)


# ----- targets and policies


def pod(name: str, ip: str, labels: dict[str, str], annotations: dict[str, str], ports: list[int]) -> Obj:
    container = {"name": "inference-server", "ports": [{"containerPort": p} for p in ports]}
    return {
        "metadata": {"name": name, "namespace": NS, "labels": labels, "annotations": annotations},
        "spec": {"containers": [container, {"name": "sidecar"}]},
        "status": {"podIP": ip},
    }


DUAL, SLEEPING = "dual-pods.llm-d.ai/dual", "dual-pods.llm-d.ai/sleeping"
# Providers carry `sleeping` ("false" while bound); requesters do not.
LAUNCHER = {"app.kubernetes.io/component": "launcher", "dual-pods.llm-d.ai/launcher-config-name": "lc"}
BOUND = pod(
    "bound",
    "127.0.5.1",
    {**LAUNCHER, DUAL: "req", SLEEPING: "false"},
    {"dual-pods.llm-d.ai/server-port": "8005", "dual-pods.llm-d.ai/instance-id": "i1"},
    [8001, 8005],
)
IDLE = pod("idle", "127.0.5.2", {**LAUNCHER, SLEEPING: "true"}, {}, [])
REQUESTER = pod("req", "127.0.5.3", {DUAL: "bound"}, {"dual-pods.llm-d.ai/inference-server-config": "isc"}, [8080])
OWN_PORT = pod("req2", "127.0.5.4", {}, {"dual-pods.llm-d.ai/server-patch": "{}",
                                         "dual-pods.llm-d.ai/admin-port": "9000"}, [])  # fmt: skip
PROVIDER = pod("provider", "127.0.5.5", {DUAL: "req2", SLEEPING: "false"}, {"dual-pods.llm-d.ai/server-patch": "{}",
                                                         "dual-pods.llm-d.ai/nominal": "x"}, [])  # fmt: skip
OTHER = pod("other", "127.0.5.6", {}, {}, [80])
PODS = [BOUND, IDLE, REQUESTER, OWN_PORT, PROVIDER, OTHER]


def targets() -> dict[str, set[Target]]:
    return {m["metadata"]["name"]: pod_monitor_targets(m, PODS) for m in of_kind(render(*MONITORS_ON), "PodMonitor")}


def test_the_pod_monitors_find_launchers_serving_instances_and_requesters_on_their_metrics_ports() -> None:
    found = {name: {(t.pod, t.address, t.path) for t in each} for name, each in targets().items()}
    assert found == {
        "rel-launchers": {("bound", "127.0.5.1:8001", "/metrics"), ("idle", "127.0.5.2:8001", "/metrics")},
        "rel-instances": {("bound", "127.0.5.1:8005", "/metrics")},
        "rel-requesters": {("req", "127.0.5.3:8081", "/metrics"), ("req2", "127.0.5.4:9000", "/metrics")},
    }
    (instance,) = targets()["rel-instances"]
    assert (instance.label("instance_id"), instance.label("dualpods_target")) == ("i1", "instance")
    assert {t.label("dualpods_release") for each in targets().values() for t in each} == {"rel"}


@pytest.mark.parametrize(
    "settings", [[], ["networkPolicy.monitoring.podSelector.matchLabels.app\\.kubernetes\\.io/name=p"]]
)
def test_the_network_policies_admit_the_monitoring_namespace_to_exactly_the_metrics_ports(settings: list[str]) -> None:
    policies = of_kind(render(*MONITORS_ON, *settings), "NetworkPolicy")
    for each in targets().values():
        for target in each:
            scraped = next(p for p in PODS if p["metadata"]["name"] == target.pod)
            assert admits(policies, scraped, target.port, PROMETHEUS), target
    other_namespace = Scraper("default", {"kubernetes.io/metadata.name": "default"}, PROMETHEUS.labels)
    assert not admits(policies, BOUND, 8001, other_namespace)
    assert not admits(policies, REQUESTER, 8081, other_namespace)
    metrics_policies = [p for p in policies if p["metadata"]["name"].endswith("-metrics")]
    assert {p["metadata"]["name"]: [port["port"] for r in p["spec"]["ingress"] for port in r["ports"]]
            for p in metrics_policies} == {"rel-launcher-metrics": [8001], "rel-requester-metrics": [8081]}  # fmt: skip


def test_the_monitoring_namespace_admission_can_be_turned_off() -> None:
    policies = of_kind(render("networkPolicy.monitoring.enabled=false"), "NetworkPolicy")
    assert not admits(policies, BOUND, 8001, PROMETHEUS)
    assert not [p for p in policies if p["metadata"]["name"].endswith("-metrics")]
