"""The Helm chart: lint, schema validation of what it renders, Pod Security, the values' schema, stable renders,
the standard knobs, tenant installs, and the shape of what it grants."""

import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from api import keys
from api.version import release
from controller.__main__ import parse_args
from scripts.helm_chart import CHART, REPO, helm, render_chart, run_helm
from tests.pod_security import restricted_violations

KUBE_VERSION = "1.35.0"
EVERYTHING_ON = [
    "dualPodsController.replicas=2",
    "launcherPopulator.replicas=3",
    "serviceMonitor.enabled=true",
    "podMonitors.enabled=true",
    "prometheusRule.enabled=true",
    "grafanaDashboard.enabled=true",
    "admissionPolicies.enabled=true",
]
# Every knob a platform team sets, at once.
KNOBS = [
    "global.imageRegistry=registry.example.com",
    "imagePullSecrets[0].name=pull",
    "nodeSelector.pool=system",
    "tolerations[0].key=dedicated",
    "tolerations[0].operator=Exists",
    "podAnnotations.team=ml",
    "podLabels.cost-center=cc42",
    "priorityClassName=system-cluster-critical",
    "serviceAccount.annotations.iam\\.gke\\.io/gcp-service-account=sa@p.iam.gserviceaccount.com",
    "serviceAccount.name=models-fma-controllers",
    "fullnameOverride=models",
    "nameOverride=swapper",
    "dualPodsController.extraArgs[0]=--log-level=debug",
    "dualPodsController.extraEnv[0].name=PYTHONASYNCIODEBUG",
    "dualPodsController.extraEnv[0].value=on",
    "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool",
    "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
]
TENANT = ["crds.install=false", "rbac.clusterScoped=false"]
CLUSTER_SCOPED = {"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                  "ValidatingAdmissionPolicyBinding", "MutatingWebhookConfiguration"}  # fmt: skip
Obj = dict[str, Any]


def render(*settings: str, kube_version: str = KUBE_VERSION) -> list[Obj]:
    return render_chart("rel", "models", *settings, kube_version=kube_version)


def by_kind(docs: list[Obj], kind: str) -> list[Obj]:
    return [d for d in docs if d["kind"] == kind]


def deployment(docs: list[Obj], name: str) -> Obj:
    (found,) = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == name]
    return found


def controllers_role(docs: list[Obj]) -> Obj:
    (role,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-fma-controllers")]
    return role


def container(workload: Obj) -> Obj:
    pod = workload["spec"]["template"]["spec"] if workload["kind"] == "Deployment" else workload["spec"]
    first: Obj = pod["containers"][0]
    return first


def template_fails(*settings: str) -> str:
    """helm template's error message for values it must refuse."""
    done = run_helm("template", "rel", str(CHART), *(f"--set={s}" for s in settings))
    assert done.returncode != 0, f"{settings} were accepted"
    return done.stderr


def test_lint_strict() -> None:
    helm("lint", "--strict", str(CHART))


@pytest.mark.parametrize(
    "settings", [[], EVERYTHING_ON, KNOBS, [*TENANT, "launcherToken.existingSecret=mine"]],
    ids=["defaults", "everything-on", "knobs", "tenant"],
)  # fmt: skip
def test_rendered_objects_are_valid_kubernetes(settings: list[str]) -> None:
    problems = []
    for doc in render(*settings):
        if doc["apiVersion"].startswith("monitoring.coreos.com"):
            continue  # a CRD of the Prometheus Operator: no schema ships with Kubernetes
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            problems.append(f"{doc['kind']} {doc['metadata']['name']}: {err.message}")
    assert not problems, "\n".join(problems)


# --- Pod Security "restricted" ------------------------------------------------------------------------------


def workloads(docs: list[Obj]) -> dict[str, Obj]:
    """Every Pod spec the chart renders (Deployments and the `helm test` Pod), by kind/name."""
    kinds = {"Deployment": lambda d: d["spec"]["template"]["spec"], "Pod": lambda d: d["spec"]}
    return {f"{d['kind']}/{d['metadata']['name']}": kinds[d["kind"]](d) for d in docs if d["kind"] in kinds}


@pytest.mark.parametrize("settings", [[], EVERYTHING_ON, KNOBS], ids=["defaults", "everything-on", "knobs"])
def test_every_workload_passes_the_restricted_pod_security_profile(settings: list[str]) -> None:
    found = workloads(render(*settings))
    assert sorted(name.partition("/")[0] for name in found) == ["Deployment", "Deployment", "Pod"]
    problems = [f"{name}: {p}" for name, pod in found.items() for p in restricted_violations(pod)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("unset", "problem"),
    [
        ("podSecurityContext.runAsNonRoot", "runAsNonRoot is not true"),
        ("podSecurityContext.seccompProfile", "seccompProfile"),
        ("securityContext.allowPrivilegeEscalation", "allowPrivilegeEscalation is not false"),
        ("securityContext.capabilities", "capabilities do not drop ALL"),
        ("securityContext.readOnlyRootFilesystem", "readOnlyRootFilesystem is not true"),
    ],
)
def test_a_workload_missing_a_restricted_field_is_caught(unset: str, problem: str) -> None:
    """The check above fails when the chart's defaults lose a field (here: a user unsets it)."""
    pod = workloads(render(f"{unset}=null"))["Deployment/rel-dual-pods-controller"]
    assert any(problem in p for p in restricted_violations(pod))


def test_the_controllers_write_only_to_their_tmp_volume() -> None:
    for name, pod in workloads(render()).items():
        if name.startswith("Deployment/"):
            assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]
            mounts = {m["mountPath"]: m.get("readOnly", False) for m in pod["containers"][0]["volumeMounts"]}
            assert mounts.pop("/tmp") is False
            assert all(mounts.values()), mounts  # everything else mounted read-only


# --- values: schema, FMA's names, stable renders ------------------------------------------------------------


def test_a_misspelt_value_fails_naming_it() -> None:
    assert "additional properties 'dualPodController' not allowed" in template_fails("dualPodController.replicas=2")
    assert "additional properties 'replica' not allowed" in template_fails("dualPodsController.replica=2")
    assert "/dualPodsController/replicas" in template_fails("dualPodsController.replicas=-1")
    assert "/dualPodsController/logLevel" in template_fails("dualPodsController.logLevel=verbose")


@pytest.mark.parametrize(
    ("fma_value", "ours"),
    [
        ("launcherPopulator.replicaCount=2", "launcherPopulator.replicas"),
        ("replicaCount=2", "dualPodsController.replicas"),
        ("launcherPopulator.pullPolicy=Always", "image.pullPolicy"),
        ("global.local=true", "image.pullPolicy"),
        ("dualPodsController.debugAcceleratorMemory=true", "sleeperBudget"),
    ],
)
def test_fma_chart_values_without_a_meaning_here_fail_naming_ours(fma_value: str, ours: str) -> None:
    message = template_fails(fma_value)
    key = fma_value.partition("=")[0]
    assert f"FMA chart value {key}" in message
    assert ours in message


def test_fma_chart_globals_work() -> None:
    docs = render(
        "global.imageRegistry=ghcr.io/example/", "global.imageTag=v9", "global.nodeViewClusterRole=view-nodes"
    )
    assert container(deployment(docs, "rel-dual-pods-controller"))["image"] == "ghcr.io/example/dualpods/controller:v9"
    # The node-view ClusterRole is the given one; the chart's own: placement's webhook configuration, TokenReviews.
    assert sorted(r["metadata"]["name"] for r in by_kind(docs, "ClusterRole")) == [
        "models-rel-placement",
        "models-rel-requester-tokenreview",
    ]
    (binding,) = [b for b in by_kind(docs, "ClusterRoleBinding") if b["metadata"]["name"] == "models-rel-node-view"]
    assert binding["roleRef"]["name"] == "view-nodes"
    assert [s["name"] for s in binding["subjects"]] == ["rel-fma-controllers"]
    image = container(deployment(render("image.tag=1.2", "global.imageTag=v9"), "rel-dual-pods-controller"))["image"]
    assert image == "dualpods/controller:1.2"  # the chart's own value wins


def test_the_controllers_service_account_keeps_the_suffix_only_where_the_admission_policies_need_it() -> None:
    refused = template_fails("serviceAccount.name=controllers")
    assert 'serviceAccount.name "controllers" lacks the suffix -fma-controllers' in refused
    assert "admissionPolicies.enabled=false" in refused
    docs = render("serviceAccount.name=controllers", "admissionPolicies.enabled=false")
    pod = deployment(docs, "rel-dual-pods-controller")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "controllers"
    assert not by_kind(docs, "ValidatingAdmissionPolicy")
    # A tenant install renders no policies, so nothing asks for the suffix there.
    assert render("serviceAccount.name=controllers", *TENANT)
    assert "/serviceAccount/name" in template_fails("serviceAccount.name=Not_A_Name")


def test_two_renders_with_the_same_values_are_byte_identical() -> None:
    """GitOps tools render the chart on every sync: nothing random, nothing from the cluster."""
    args = ["template", "rel", str(CHART), "-n", "models", "--include-crds", *(f"--set={s}" for s in EVERYTHING_ON)]
    assert helm(*args) == helm(*args)
    assert not by_kind(render(), "Secret")


def _keys(values: Obj, prefix: str = "") -> list[str]:
    """Every key of values.yaml, as a dotted path (maps that users fill in count as leaves)."""
    found = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        found.append(path)
        if (
            isinstance(value, dict)
            and value
            and not key.endswith(
                ("Labels", "labels", "Annotations", "annotations", "Selector", "resources", "requests", "limits")
            )
        ):
            found += _keys(value, f"{path}.")
    return found


def test_every_value_is_described_by_the_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    undescribed = []
    for path in _keys(values):
        node = schema
        for part in path.split("."):
            node = node.get("properties", {}).get(part, {})
        if not node.get("description") and not path.startswith(("podSecurityContext.", "securityContext.")):
            undescribed.append(path)
    assert not undescribed


# --- the standard knobs --------------------------------------------------------------------------------------


def test_the_standard_knobs_reach_both_controllers() -> None:
    docs = render(*KNOBS)
    for name in ("models-dual-pods-controller", "models-launcher-populator"):
        workload = deployment(docs, name)
        assert workload["metadata"]["labels"]["app.kubernetes.io/name"] == "swapper"
        template = workload["spec"]["template"]
        pod = template["spec"]
        assert container(workload)["image"] == f"registry.example.com/dualpods/controller:{release()}"
        assert pod["imagePullSecrets"] == [{"name": "pull"}]
        assert pod["nodeSelector"] == {"pool": "system"}
        assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
        assert pod["priorityClassName"] == "system-cluster-critical"
        assert pod["serviceAccountName"] == "models-fma-controllers"
        assert list(pod["affinity"]) == ["nodeAffinity"]  # yours replaces the default anti-affinity
        assert template["metadata"]["annotations"] == {"team": "ml"}
        assert template["metadata"]["labels"]["cost-center"] == "cc42"
    dual_pods = container(deployment(docs, "models-dual-pods-controller"))
    assert dual_pods["args"][-1] == "--log-level=debug"
    assert {"name": "PYTHONASYNCIODEBUG", "value": "on"} in dual_pods["env"]
    assert "--requester-token-service-account=models-fma-controllers" in dual_pods["args"]
    (account,) = [a for a in by_kind(docs, "ServiceAccount") if a["metadata"]["name"] == "models-fma-controllers"]
    assert account["metadata"]["annotations"] == {"iam.gke.io/gcp-service-account": "sa@p.iam.gserviceaccount.com"}
    (test_pod,) = by_kind(docs, "Pod")
    assert test_pod["spec"]["imagePullSecrets"] == [{"name": "pull"}]
    assert container(test_pod)["image"] == "registry.example.com/python:3.12-slim"


def test_the_chart_the_app_and_the_wheel_are_one_release() -> None:
    """One number for the wheel, the images built from it (the chart's default tag is its appVersion), the chart and
    its CRD subchart; the CHANGELOG has a section for it."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    crds = yaml.safe_load((CHART / "charts" / "crds" / "Chart.yaml").read_text())
    (dependency,) = chart["dependencies"]
    assert {chart["version"], chart["appVersion"], crds["version"], crds["appVersion"], dependency["version"]} == {
        release()
    }
    assert f"\n## {release()} " in (REPO / "CHANGELOG.md").read_text()


def test_a_digest_pins_the_image() -> None:
    digest = "sha256:" + "ab" * 32
    image = container(deployment(render(f"image.digest={digest}"), "rel-dual-pods-controller"))["image"]
    assert image == f"dualpods/controller@{digest}"


def test_warm_launchers_get_a_disruption_budget_that_a_drain_waits_on() -> None:
    """Launchers the dual-pods controller labels warm (they hold sleepers) cannot be evicted; the controller removes
    the label once a drain's copies are asleep elsewhere, or after --drain-rewarm-timeout."""
    docs = render()
    (budget,) = [b for b in by_kind(docs, "PodDisruptionBudget") if b["metadata"]["name"] == "rel-warm-launchers"]
    assert budget["spec"]["maxUnavailable"] == 0
    launcher_labels = {keys.COMPONENT_LABEL: keys.LAUNCHER_COMPONENT, keys.LAUNCHER_WARM_LABEL: "true"}
    assert budget["spec"]["selector"] == {"matchLabels": launcher_labels}
    assert "--drain-rewarm-timeout=600" in container(deployment(docs, "rel-dual-pods-controller"))["args"]
    off = render("launcherDisruptionBudget.enabled=false", "dualPodsController.drainRewarmTimeout=30")
    assert not by_kind(off, "PodDisruptionBudget")
    assert "--drain-rewarm-timeout=30" in container(deployment(off, "rel-dual-pods-controller"))["args"]


def test_several_replicas_get_a_disruption_budget_and_spread_over_nodes() -> None:
    docs = render("dualPodsController.replicas=2", "launcherPopulator.replicas=3")
    budgets = {b["metadata"]["name"]: b for b in by_kind(docs, "PodDisruptionBudget")}
    del budgets["rel-warm-launchers"]
    assert set(budgets) == {"rel-dual-pods-controller", "rel-launcher-populator"}
    for name, budget in budgets.items():
        assert budget["apiVersion"] == "policy/v1"
        assert budget["spec"]["maxUnavailable"] == 1
        assert budget["spec"]["selector"] == deployment(docs, name)["spec"]["selector"]
        anti = deployment(docs, name)["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
        assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        assert term["podAffinityTerm"]["labelSelector"] == deployment(docs, name)["spec"]["selector"]
    single = render()
    assert [b["metadata"]["name"] for b in by_kind(single, "PodDisruptionBudget")] == ["rel-warm-launchers"]
    assert "affinity" not in deployment(single, "rel-dual-pods-controller")["spec"]["template"]["spec"]


def test_leader_election_follows_the_replica_count() -> None:
    assert "--leader-elect" not in container(deployment(render(), "rel-dual-pods-controller"))["args"]
    assert "--leader-elect" in container(deployment(render(*EVERYTHING_ON), "rel-dual-pods-controller"))["args"]


def test_the_helm_test_pod_checks_the_enabled_controllers_and_is_no_controller_itself() -> None:
    (pod,) = by_kind(render(*EVERYTHING_ON), "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    env = {e["name"]: e.get("value") for e in container(pod)["env"]}
    assert env["CHECK_COMPONENTS"] == (
        "dual-pods-controller:2:8002:dualpods-dual-pods,launcher-populator:3:8002:dualpods-populator"
    )
    # The NetworkPolicies let the chart's controllers (selected by app.kubernetes.io/name) reach the launchers.
    assert "app.kubernetes.io/name" not in pod["metadata"]["labels"]
    assert container(pod)["args"][0] == (CHART / "files" / "helm_test.py").read_text()
    docs = render(*EVERYTHING_ON)
    (role,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"] == "rel-test"]
    assert role["rules"] == [  # nothing it could change
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "resourceNames": ["dualpods-dual-pods", "dualpods-populator"], "verbs": ["get"]},
    ]  # fmt: skip
    assert all("helm.sh/hook" not in (d["metadata"].get("annotations") or {}) for d in docs if d["kind"] != "Pod")
    (pod,) = by_kind(render("launcherPopulator.enabled=false"), "Pod")
    assert {e["name"]: e.get("value") for e in container(pod)["env"]}["CHECK_COMPONENTS"] == (
        "dual-pods-controller:1:8002:dualpods-dual-pods"
    )


# --- the launcher token ---------------------------------------------------------------------------------------


def test_the_controllers_create_the_token_secret_and_may_read_only_it() -> None:
    docs = render()
    assert not by_kind(docs, "Secret")  # made at run time, by the first controller to start
    for workload in by_kind(docs, "Deployment"):
        arguments = container(workload)["args"]
        assert "--launcher-token-secret=rel-launcher-token" in arguments
        assert "--create-launcher-token-secret" in arguments
    volumes = deployment(docs, "rel-dual-pods-controller")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "launcher-token", "secret": {"secretName": "rel-launcher-token", "optional": True}} in volumes
    role = controllers_role(docs)
    secret_rules = [r for r in role["rules"] if r["resources"] == ["secrets"]]
    assert secret_rules == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["rel-launcher-token"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    ]


def test_an_existing_token_secret_is_used_as_it_is() -> None:
    docs = render("launcherToken.existingSecret=mine")
    for workload in by_kind(docs, "Deployment"):
        arguments = container(workload)["args"]
        assert "--launcher-token-secret=mine" in arguments
        assert "--create-launcher-token-secret" not in arguments
    volumes = deployment(docs, "rel-dual-pods-controller")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "launcher-token", "secret": {"secretName": "mine"}} in volumes  # waited for, not optional
    role = controllers_role(docs)
    assert [r["verbs"] for r in role["rules"] if r["resources"] == ["secrets"]] == [["get"]]
    docs = render("launcherToken.enabled=false")
    assert not [a for w in by_kind(docs, "Deployment") for a in container(w)["args"] if "launcher-token" in a]
    role = controllers_role(docs)
    assert not [r for r in role["rules"] if r["resources"] == ["secrets"]]


def test_the_launcher_runtime_class_reaches_both_controllers() -> None:
    """Both build identical launcher Pods, so both get the RuntimeClass, as the controllers' parser reads it."""
    for workload in ("rel-dual-pods-controller", "rel-launcher-populator"):
        arguments = container(deployment(render("launcherRuntimeClassName=nvidia-legacy"), workload))["args"]
        assert parse_args(arguments).launcher_runtime_class == "nvidia-legacy"
        assert parse_args(container(deployment(render(), workload))["args"]).launcher_runtime_class is None
    assert template_fails("launcherRuntimeClassName=Not_A_Name")


# --- RBAC and tenant installs ----------------------------------------------------------------------------------


def test_least_privilege() -> None:
    docs = render()
    cluster_roles = {role["metadata"]["name"]: role["rules"] for role in by_kind(docs, "ClusterRole")}
    assert cluster_roles == {
        "models-rel-node-view": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["get", "list", "watch"]},
        ],
        "models-rel-requester-tokenreview": [
            {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}
        ],
        # Placement: its one webhook configuration, which the leader points at itself.
        "models-rel-placement": [
            {
                "apiGroups": ["admissionregistration.k8s.io"],
                "resources": ["mutatingwebhookconfigurations"],
                "resourceNames": ["models-rel-placement"],
                "verbs": ["get", "patch"],
            }
        ],
    }
    (webhook,) = by_kind(docs, "MutatingWebhookConfiguration")
    assert webhook["metadata"]["name"] == "models-rel-placement"
    assert webhook["webhooks"][0]["failurePolicy"] == "Ignore"  # never holds a requester back
    assert webhook["webhooks"][0]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "models"}}
    role = controllers_role(docs)
    granted = {
        (group, resource) for rule in role["rules"] for group in rule["apiGroups"] for resource in rule["resources"]
    }
    assert granted <= {
        ("", "pods"), ("", "configmaps"), ("", "events"), ("events.k8s.io", "events"), ("", "secrets"),
        ("coordination.k8s.io", "leases"), ("fma.llm-d.ai", "inferenceserverconfigs"),
        ("fma.llm-d.ai", "launcherconfigs"), ("fma.llm-d.ai", "launcherpopulationpolicies"),
        ("fma.llm-d.ai", "inferenceserverconfigs/status"), ("fma.llm-d.ai", "launcherconfigs/status"),
        ("fma.llm-d.ai", "launcherpopulationpolicies/status"), ("", "serviceaccounts/token"),
        ("resource.k8s.io", "resourceclaimtemplates"),
    }  # fmt: skip
    for rule in role["rules"]:
        if rule["resources"] != ["pods"]:
            assert "delete" not in rule["verbs"], rule
        if rule["resources"] == ["serviceaccounts/token"]:  # tokens of its own ServiceAccount only
            assert (rule["verbs"], rule["resourceNames"]) == (["create"], ["rel-fma-controllers"])
        if rule["resources"] == ["resourceclaimtemplates"]:  # placement's derived templates: made, never changed
            assert rule["verbs"] == ["get", "create"]
        if rule["apiGroups"] == ["fma.llm-d.ai"]:  # the controllers never change what users declared
            assert set(rule["verbs"]) <= {"get", "list", "watch"} or all(
                r.endswith("/status") for r in rule["resources"]
            )
    accounts = [account["metadata"]["name"] for account in by_kind(docs, "ServiceAccount")]
    assert accounts == ["rel-fma-controllers", "rel-requester", "rel-test"]  # the first: FMA's policies exempt it


def test_a_tenant_install_renders_nothing_cluster_scoped() -> None:
    docs = render(*TENANT)
    assert not [f"{d['kind']}/{d['metadata']['name']}" for d in docs if d["kind"] in CLUSTER_SCOPED]
    assert {"Role", "RoleBinding", "Deployment"} <= {d["kind"] for d in docs}
    assert "crds.install=false" in helm(
        "install", "rel", str(CHART), "--dry-run=client", *(f"--set={s}" for s in TENANT)
    )
    fails = template_fails(*TENANT, "global.nodeViewClusterRole=view-nodes")
    assert "rbac.clusterScoped=false" in fails


def test_the_crds_come_from_config_crd_and_can_be_left_out() -> None:
    crds = {d["metadata"]["name"]: d for d in render() if d["kind"] == "CustomResourceDefinition"}
    committed = {p.name: yaml.safe_load(p.read_text()) for p in (REPO / "config" / "crd").glob("*.yaml")}
    assert sorted(crds.values(), key=str) == sorted(committed.values(), key=str)
    assert not [d for d in render("crds.install=false") if d["kind"] == "CustomResourceDefinition"]


def test_requesters_may_review_the_controllers_tokens() -> None:
    """The controller asks for tokens of its ServiceAccount; requester Pods (the chart's account, and the
    namespace's default one unless turned off) may create TokenReviews; turned off, none of it is rendered."""
    docs = render()
    (binding,) = [b for b in by_kind(docs, "ClusterRoleBinding") if b["roleRef"]["name"].endswith("-tokenreview")]
    assert [(s["name"], s["namespace"]) for s in binding["subjects"]] == [("rel-requester", "models"),
                                                                           ("default", "models")]  # fmt: skip
    dual_pods = container(deployment(docs, "rel-dual-pods-controller"))
    assert "--requester-token-service-account=rel-fma-controllers" in dual_pods["args"]
    assert {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}} in dual_pods["env"]
    docs = render("requesterAuth.tokenReviewForDefaultServiceAccount=false")
    (binding,) = [b for b in by_kind(docs, "ClusterRoleBinding") if b["roleRef"]["name"].endswith("-tokenreview")]
    assert [s["name"] for s in binding["subjects"]] == ["rel-requester"]
    docs = render("requesterAuth.enabled=false")
    assert not [b for b in by_kind(docs, "ClusterRoleBinding") if b["roleRef"]["name"].endswith("-tokenreview")]
    assert not [a for a in container(deployment(docs, "rel-dual-pods-controller"))["args"] if "requester-token" in a]
    role = controllers_role(docs)
    assert all(rule["resources"] != ["serviceaccounts/token"] for rule in role["rules"])


@pytest.mark.parametrize(("policy_name", "port"), [("rel-launcher-api", 8001), ("rel-requester-spi", 8081)])
def test_only_the_controllers_reach_the_launcher_api_and_the_requester_spi(policy_name: str, port: int) -> None:
    (policy,) = [p for p in by_kind(render(), "NetworkPolicy") if p["metadata"]["name"] == policy_name]
    controllers, everyone = policy["spec"]["ingress"]
    assert controllers["ports"] == [{"protocol": "TCP", "port": port}]
    assert controllers["from"][0]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/instance": "rel", "app.kubernetes.io/name": "dualpods"
    }  # fmt: skip
    assert "from" not in everyone
    assert all(not (p["port"] <= port <= p["endPort"]) for p in everyone["ports"])
    assert {(p["port"], p["endPort"]) for p in everyone["ports"]} == {(1, port - 1), (port + 1, 65535)}


def test_the_requester_spi_policy_covers_bound_requesters_and_no_provider() -> None:
    """Providers (launchers, direct providers) carry the `dual` label too, and `sleeping`; a policy that
    selected them would open their API port to everyone (NetworkPolicies add up)."""
    (policy,) = [p for p in by_kind(render(), "NetworkPolicy") if p["metadata"]["name"] == "rel-requester-spi"]
    assert policy["spec"]["podSelector"] == {"matchExpressions": [
        {"key": "dual-pods.llm-d.ai/dual", "operator": "Exists"},
        {"key": "dual-pods.llm-d.ai/sleeping", "operator": "DoesNotExist"},
    ]}  # fmt: skip


def test_the_dashboard_is_current() -> None:
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "dashboard.py"), "--check"], check=False)
    assert done.returncode == 0
    (configmap,) = [d for d in by_kind(render(*EVERYTHING_ON), "ConfigMap") if "dashboard" in d["metadata"]["name"]]
    assert '"uid": "dualpods"' in configmap["data"]["dualpods.json"]


def test_the_packaged_chart_carries_the_crds_as_files(tmp_path: Path) -> None:
    """What a chart repository or a GitOps tool gets (`helm package`) holds the three CRDs themselves."""
    helm("package", str(CHART), "--destination", str(tmp_path))
    (packaged,) = tmp_path.glob("dualpods-*.tgz")
    with tarfile.open(packaged) as archive:
        assert not [m.name for m in archive.getmembers() if m.issym() or m.islnk()]
    docs = [yaml.safe_load(d) for d in helm("template", "rel", str(packaged), "--include-crds").split("\n---")]
    crds = sorted(d["metadata"]["name"] for d in docs if d and d["kind"] == "CustomResourceDefinition")
    assert crds == [f"{plural}.fma.llm-d.ai" for plural in ("inferenceserverconfigs", "launcherconfigs",
                                                            "launcherpopulationpolicies")]  # fmt: skip
