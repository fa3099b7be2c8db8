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
    cluster_roles = {role["metadata"]["name"]: role["rules"] for role in by_kind(docs, "ClusterRole")}
    assert cluster_roles == {
        "models-rel-node-view": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}],
        "models-rel-requester-tokenreview": [
            {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}
        ],
    }
    (role,) = by_kind(docs, "Role")
    granted = {
        (group, resource) for rule in role["rules"] for group in rule["apiGroups"] for resource in rule["resources"]
    }
    assert granted <= {
        ("", "pods"), ("", "configmaps"), ("", "events"), ("events.k8s.io", "events"),
        ("coordination.k8s.io", "leases"), ("fma.llm-d.ai", "inferenceserverconfigs"),
        ("fma.llm-d.ai", "launcherconfigs"), ("fma.llm-d.ai", "launcherpopulationpolicies"),
        ("fma.llm-d.ai", "launcherconfigs/status"), ("fma.llm-d.ai", "launcherpopulationpolicies/status"),
        ("", "serviceaccounts/token"),
    }  # fmt: skip
    for rule in role["rules"]:
        if rule["resources"] != ["pods"]:
            assert "delete" not in rule["verbs"], rule
        if rule["resources"] == ["serviceaccounts/token"]:  # E15: tokens of its own ServiceAccount only
            assert (rule["verbs"], rule["resourceNames"]) == (["create"], ["rel-fma-controllers"])
    accounts = [account["metadata"]["name"] for account in by_kind(docs, "ServiceAccount")]
    assert accounts == ["rel-fma-controllers", "rel-requester"]  # the first is what FMA's admission policies exempt


def test_requesters_may_review_the_controllers_tokens(tmp_path: Path) -> None:
    """E15: the controller asks for tokens of its ServiceAccount; requester Pods (the chart's account, and the
    namespace's default one unless turned off) may create TokenReviews; turned off, none of it is rendered."""
    docs = render(tmp_path)
    (binding,) = [b for b in by_kind(docs, "ClusterRoleBinding") if b["roleRef"]["name"].endswith("-tokenreview")]
    assert [(s["name"], s["namespace"]) for s in binding["subjects"]] == [("rel-requester", "models"),
                                                                           ("default", "models")]  # fmt: skip
    (deployment,) = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "rel-dual-pods-controller"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--requester-token-service-account=rel-fma-controllers" in container["args"]
    assert {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}} in container["env"]
    docs = render(tmp_path, "requesterAuth.tokenReviewForDefaultServiceAccount=false")
    (binding,) = [b for b in by_kind(docs, "ClusterRoleBinding") if b["roleRef"]["name"].endswith("-tokenreview")]
    assert [s["name"] for s in binding["subjects"]] == ["rel-requester"]
    docs = render(tmp_path, "requesterAuth.enabled=false")
    assert not [b for b in by_kind(docs, "ClusterRoleBinding") if b["roleRef"]["name"].endswith("-tokenreview")]
    (deployment,) = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "rel-dual-pods-controller"]
    assert not [a for a in deployment["spec"]["template"]["spec"]["containers"][0]["args"] if "requester-token" in a]
    (role,) = by_kind(docs, "Role")
    assert all(rule["resources"] != ["serviceaccounts/token"] for rule in role["rules"])


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


@pytest.mark.parametrize(("policy_name", "port"), [("rel-launcher-api", 8001), ("rel-requester-spi", 8081)])
def test_only_the_controllers_reach_the_launcher_api_and_the_requester_spi(
    tmp_path: Path, policy_name: str, port: int
) -> None:
    (policy,) = [p for p in by_kind(render(tmp_path), "NetworkPolicy") if p["metadata"]["name"] == policy_name]
    controllers, everyone = policy["spec"]["ingress"]
    assert controllers["ports"] == [{"protocol": "TCP", "port": port}]
    assert controllers["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "rel"
    assert "from" not in everyone
    assert all(not (p["port"] <= port <= p["endPort"]) for p in everyone["ports"])
    assert {(p["port"], p["endPort"]) for p in everyone["ports"]} == {(1, port - 1), (port + 1, 65535)}


def test_the_requester_spi_policy_covers_bound_requesters_and_no_provider(tmp_path: Path) -> None:
    """Providers (launchers, direct providers) carry the `dual` label too, and `sleeping`; a policy that
    selected them would open their API port to everyone (NetworkPolicies add up)."""
    (policy,) = [p for p in by_kind(render(tmp_path), "NetworkPolicy") if p["metadata"]["name"] == "rel-requester-spi"]
    assert policy["spec"]["podSelector"] == {"matchExpressions": [
        {"key": "dual-pods.llm-d.ai/dual", "operator": "Exists"},
        {"key": "dual-pods.llm-d.ai/sleeping", "operator": "DoesNotExist"},
    ]}  # fmt: skip


def test_the_dashboard_is_current(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "dashboard.py"), "--check"], check=False)
    assert done.returncode == 0
    (configmap,) = [
        d for d in by_kind(render(tmp_path, *EVERYTHING_ON), "ConfigMap") if "dashboard" in d["metadata"]["name"]
    ]
    assert '"uid": "dualpods"' in configmap["data"]["dualpods.json"]
