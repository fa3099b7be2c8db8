"""FMA's admission policies as files: config/validating-admission-policies/ is generated from the chart's template
and is valid for every Kubernetes the chart supports; the chart renders them by default, except where it may not
create cluster-scoped objects. What they admit and deny is judged by a real API server in
e2e/test_admission_policies.py.

`.venv/bin/python -m scripts.admission_policies` regenerates config/ from the chart.
"""

from typing import Any

import kubernetes_validate
import pytest
import yaml

from scripts.admission_policies import CONCATENATED, CONFIG_DIR, POLICY_KINDS, generated_files
from scripts.helm_chart import CHART, REPO, render_chart, run_helm

IMMUTABLE = "fma-immutable-fields"
BOUND = "fma-bound-serverreqpod"
Obj = dict[str, Any]


@pytest.mark.parametrize(("release", "namespace"), [("dualpods", "dualpods-system"), ("team-a", "models")])
def test_config_is_the_charts_rendering_for_any_release(release: str, namespace: str) -> None:
    """One source of truth; and no release-specific text, so one copy serves every install."""
    on_disk = {path: path.read_text() for path in [*CONFIG_DIR.glob("*.yaml"), CONCATENATED] if path.exists()}
    generated = generated_files(release, namespace)
    stale = sorted(
        str(p.relative_to(REPO)) for p in on_disk.keys() | generated.keys() if on_disk.get(p) != generated.get(p)
    )
    assert not stale, f"{', '.join(stale)} differ from the chart: run `python -m scripts.admission_policies`"


def _policies(*settings: str) -> list[Obj]:
    return [d for d in render_chart("dualpods", "dualpods-system", *settings) if d["kind"] in POLICY_KINDS]


def test_the_chart_renders_the_policies_by_default() -> None:
    assert sorted(d["kind"] for d in _policies()) == sorted(POLICY_KINDS * 2)


def test_the_chart_renders_no_policies_when_disabled_or_in_a_tenant_install() -> None:
    """A second release in the cluster turns them off; a tenant may not create cluster-scoped objects."""
    assert not _policies("admissionPolicies.enabled=false")
    assert not _policies("rbac.clusterScoped=false")


def test_the_chart_refuses_kubernetes_before_1_32() -> None:
    """A clear message at install rather than the API server's refusal of the CRDs' format library (1.31+)."""
    args = ("template", "dualpods", str(CHART), "--kube-version")
    refused = run_helm(*args, "v1.31.9")
    assert refused.returncode != 0
    assert "kubeVersion" in refused.stderr
    assert run_helm(*args, "v1.32.0-eks-1a2b3c").returncode == 0


@pytest.mark.parametrize(("release", "namespace"), [("dualpods", "dualpods-system"), ("my-models", "team-b")])
def test_the_policies_carry_the_release_labels(release: str, namespace: str) -> None:
    for doc in render_chart(release, namespace):
        if doc["kind"] in POLICY_KINDS:
            assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == release


# --- the manifests ------------------------------------------------------------------------------------------


def manifests() -> list[Obj]:
    return [doc for path in sorted(CONFIG_DIR.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text())]


def _minor(version: str) -> int:
    return int(version.split(".")[1])


SUPPORTED = sorted({v for v in kubernetes_validate.utils.all_versions() if _minor(v) >= 32}, key=_minor)


@pytest.mark.parametrize("version", SUPPORTED)
def test_manifests_are_valid_kubernetes_objects(version: str) -> None:
    docs = manifests()
    assert sorted(d["kind"] for d in docs) == sorted(POLICY_KINDS * 2)
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_manifests_need_kubernetes_1_30() -> None:
    """admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy went GA in 1.30: 1.29 has no such schema."""
    with pytest.raises(kubernetes_validate.utils.SchemaNotFoundError):
        kubernetes_validate.validate(manifests()[0], "1.29.0", strict=True)


def test_policies_and_bindings_match_pod_updates_and_deny() -> None:
    docs = {d["metadata"]["name"]: d for d in manifests()}
    assert set(docs) == {IMMUTABLE, BOUND, f"bind-{IMMUTABLE}", f"bind-{BOUND}"}
    pod_updates = {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                                      "operations": ["UPDATE"]}]}  # fmt: skip
    for name in (IMMUTABLE, BOUND):
        spec, binding = docs[name]["spec"], docs[f"bind-{name}"]["spec"]
        assert (spec["failurePolicy"], spec["matchConstraints"]) == ("Fail", pod_updates)
        assert binding == {"policyName": name, "matchResources": pod_updates, "validationActions": ["Deny"]}
        for validation in spec["validations"]:
            # The API server requires a message, without line breaks, for a multi-line expression.
            assert validation["message"]
            assert "\n" not in validation["message"]
