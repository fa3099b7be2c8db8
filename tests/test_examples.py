"""config/examples/, the GPU deployment users start from: every object is valid Kubernetes 1.35 (ours parse through
the models, in tests/test_crds.py), and every Pod it makes, launchers included, passes Pod Security "restricted"."""

from typing import Any

import kubernetes_validate
import pytest

from api.crds import LauncherConfig
from e2e.crds import EXAMPLES, manifests
from tests.pod_security import restricted_violations

KUBE_VERSION = "1.35.0"


def others() -> list[dict[str, Any]]:
    return manifests(EXAMPLES, ours=False)


def test_the_examples_hold_a_whole_deployment() -> None:
    kinds = sorted({d["kind"] for d in manifests(EXAMPLES) + others()})
    assert kinds == ["Deployment", "InferenceServerConfig", "LauncherConfig", "LauncherPopulationPolicy",
                     "PersistentVolumeClaim", "Service"]  # fmt: skip


@pytest.mark.parametrize("manifest", others(), ids=lambda d: f"{d['kind']}-{d['metadata']['name']}")
def test_the_examples_are_valid_kubernetes(manifest: dict[str, Any]) -> None:
    kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)


def test_every_pod_of_the_examples_passes_the_restricted_profile() -> None:
    pods = {f"Deployment/{d['metadata']['name']}": d["spec"]["template"]["spec"] for d in others()
            if d["kind"] == "Deployment"}  # fmt: skip
    for config in manifests(EXAMPLES):
        if config["kind"] == "LauncherConfig":
            pods[f"LauncherConfig/{config['metadata']['name']}"] = LauncherConfig.from_k8s(
                config
            ).spec.pod_template.spec
    assert len(pods) == 3
    problems = [f"{name}: {problem}" for name, pod in pods.items() for problem in restricted_violations(pod)]
    assert not problems, "\n".join(problems)


def test_each_model_has_a_service_over_its_requesters_proxy() -> None:
    """A requester serves its ISC's model only: one Service per requester Deployment, selecting none of the
    others nor any launcher, on the proxy's port."""
    deployments = {d["metadata"]["name"]: d for d in others() if d["kind"] == "Deployment"}
    services = [d for d in others() if d["kind"] == "Service"]
    assert len(services) == len(deployments)
    (config,) = [d for d in manifests(EXAMPLES) if d["kind"] == "LauncherConfig"]
    for service in services:
        selector = service["spec"]["selector"].items()
        selected = [
            n for n, d in deployments.items() if selector <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert selected == [service["metadata"]["name"]]
        assert not selector <= config["spec"]["podTemplate"]["metadata"]["labels"].items()
        assert service["spec"]["ports"][0]["targetPort"] == "openai"


# The common 8xH100 machines (vCPUs, memory in GiB) and the share of each a node keeps for the kubelet, the
# system and its daemons (GKE and AKS reserve about 6-8% of memory on such machines; 10% leaves room).
H100_MACHINES = {
    "AWS p5.48xlarge": (192, 2048),
    "GCP a3-highgpu-8g": (208, 1872e9 / 2**30),
    "Azure ND96isr_H100_v5": (96, 1900),
}
NODE_RESERVE = 0.10


def _quantity(value: str) -> float:
    """CPUs or GiB of a Kubernetes quantity as the examples write them."""
    units = {"m": 1e-3, "Mi": 2**-10, "Gi": 1.0, "Ti": 2**10}
    for suffix, scale in units.items():
        if value.endswith(suffix):
            return float(value.removesuffix(suffix)) * scale
    return float(value)


def test_a_node_of_launchers_and_requesters_fits_each_common_h100_machine() -> None:
    """One launcher and one requester per GPU (the policy's count), their requests and limits within what each
    machine type leaves allocatable."""
    (policy,) = [d for d in manifests(EXAMPLES) if d["kind"] == "LauncherPopulationPolicy"]
    (count,) = [c["launcherCount"] for c in policy["spec"]["countForLauncher"]]
    (config,) = [d for d in manifests(EXAMPLES) if d["kind"] == "LauncherConfig"]
    (launcher,) = config["spec"]["podTemplate"]["spec"]["containers"]
    requester = next(d for d in others() if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]

    def per_node(kind: str, resource: str) -> float:
        return float(count) * sum(_quantity(c["resources"][kind][resource]) for c in (launcher, requester))

    budget = _quantity(config["spec"]["sleeperBudget"]["hostMemoryBytes"])
    assert budget < _quantity(launcher["resources"]["limits"]["memory"]), "sleepers fit the launcher's limit"
    for machine, (cpus, memory) in H100_MACHINES.items():
        assert per_node("requests", "cpu") <= cpus * (1 - NODE_RESERVE), machine
        assert per_node("limits", "memory") <= memory * (1 - NODE_RESERVE), machine
