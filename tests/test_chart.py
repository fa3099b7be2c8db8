"""The Helm chart: lint, schema validation of what it renders, and the shape of what it grants."""

import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from e2e.chart import CHART
from scripts.helm_chart import REPO, helm, render_chart

KUBE_VERSION = "1.30.0"
EVERYTHING_ON = [
    "dualPodsController.replicas=2",
    "serviceMonitor.enabled=true",
    "grafanaDashboard.enabled=true",
    "admissionPolicies.enabled=true",
]


def render(tmp_path: Path, *settings: str) -> list[dict[str, Any]]:
    return render_chart("rel", "models", *settings, kube_version=KUBE_VERSION)


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_lint_strict() -> None:
    helm("lint", "--strict", str(CHART))


@pytest.mark.parametrize("settings", [[], EVERYTHING_ON], ids=["defaults", "everything-on"])
def test_rendered_objects_are_valid_kubernetes(tmp_path: Path, settings: list[str]) -> None:
    problems = []
    for doc in render(tmp_path, *settings):
        if doc["apiVersion"].startswith("monitoring.coreos.com"):
            continue  # a CRD of the Prometheus Operator: no schema ships with Kubernetes
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            problems.append(f"{doc['kind']} {doc['metadata']['name']}: {err.message}")
    assert not problems, "\n".join(problems)


def test_least_privilege(tmp_path: Path) -> None:
    docs = render(tmp_path)
    (cluster_role,) = by_kind(docs, "ClusterRole")
    assert cluster_role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    (role,) = by_kind(docs, "Role")
    granted = {
        (group, resource) for rule in role["rules"] for group in rule["apiGroups"] for resource in rule["resources"]
    }
    assert granted <= {
        ("", "pods"), ("", "configmaps"), ("", "events"), ("events.k8s.io", "events"),
        ("coordination.k8s.io", "leases"), ("fma.llm-d.ai", "inferenceserverconfigs"),
        ("fma.llm-d.ai", "launcherconfigs"), ("fma.llm-d.ai", "launcherpopulationpolicies"),
        ("fma.llm-d.ai", "launcherconfigs/status"), ("fma.llm-d.ai", "launcherpopulationpolicies/status"),
    }  # fmt: skip
    for rule in role["rules"]:
        if rule["resources"] != ["pods"]:
            assert "delete" not in rule["verbs"], rule
    (account,) = by_kind(docs, "ServiceAccount")
    assert account["metadata"]["name"] == "rel-fma-controllers"  # what FMA's admission policies exempt


def test_leader_election_follows_the_replica_count(tmp_path: Path) -> None:
    def args(docs: list[dict[str, Any]], component: str) -> list[str]:
        (deployment,) = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == f"rel-{component}"]
        container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
        return list(container["args"])

    assert "--leader-elect" not in args(render(tmp_path), "dual-pods-controller")
    assert "--leader-elect" in args(render(tmp_path, *EVERYTHING_ON), "dual-pods-controller")


def test_both_controllers_give_launchers_the_same_token_secret(tmp_path: Path) -> None:
    docs = render(tmp_path)
    (secret,) = by_kind(docs, "Secret")
    for deployment in by_kind(docs, "Deployment"):
        arguments = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        assert f"--launcher-token-secret={secret['metadata']['name']}" in arguments


def test_only_the_controllers_reach_the_launcher_api(tmp_path: Path) -> None:
    (policy,) = by_kind(render(tmp_path), "NetworkPolicy")
    controllers, everyone = policy["spec"]["ingress"]
    assert controllers["ports"] == [{"protocol": "TCP", "port": 8001}]
    assert controllers["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "rel"
    assert "from" not in everyone
    assert all(not (p["port"] <= 8001 <= p["endPort"]) for p in everyone["ports"])


def test_the_dashboard_is_current(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "dashboard.py"), "--check"], check=False)
    assert done.returncode == 0
    (configmap,) = [
        d for d in by_kind(render(tmp_path, *EVERYTHING_ON), "ConfigMap") if "dashboard" in d["metadata"]["name"]
    ]
    assert '"uid": "dualpods"' in configmap["data"]["dualpods.json"]
