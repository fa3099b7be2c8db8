"""The launcher template as the populator relies on it (FMA's pod-helper_test.go): the template hash is
what makes a launcher stale, so it must be stable across list order and change with content, and be
the same for every node."""

import copy
from typing import Any

import pytest

from api import keys
from api.crds import LauncherConfig
from controller.dualpods.phases import LAUNCHER_START_BUDGET
from controller.launcher_template import TemplateError, launcher_config_hash, node_independent_pod, pod_for_node
from tests.test_populator_fakes import config_manifest

VOLUMES = [{"name": "b", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]
MOUNTS = [{"name": "b", "mountPath": "/b"}, {"name": "a", "mountPath": "/a"}]


def config(**container: Any) -> LauncherConfig:
    manifest = config_manifest()
    manifest["spec"]["podTemplate"]["spec"]["containers"][0].update(container)
    manifest["spec"]["podTemplate"]["spec"]["volumes"] = copy.deepcopy(VOLUMES)
    return LauncherConfig.from_k8s(manifest)


def template_hash(lc: LauncherConfig) -> str:
    return node_independent_pod(lc)[1]


def test_the_hash_is_deterministic_and_ignores_list_order() -> None:
    lc = config(volumeMounts=MOUNTS)
    reordered = config(volumeMounts=MOUNTS[::-1])
    reordered.spec.pod_template.spec["volumes"].reverse()
    assert template_hash(lc) == template_hash(config(volumeMounts=MOUNTS)) == template_hash(reordered)


@pytest.mark.parametrize("change", [{"image": "l:2"}, {"args": ["--port", "8001"]}])
def test_the_hash_changes_with_the_content(change: dict[str, Any]) -> None:
    assert template_hash(config()) != template_hash(config(**change))


def test_the_hash_is_node_independent_and_the_config_hash_is_not() -> None:
    pod, hash_ = node_independent_pod(config())
    on_a, on_b = pod_for_node(pod, hash_, "node-a"), pod_for_node(pod, hash_, "node-b")
    for node, placed in (("node-a", on_a), ("node-b", on_b)):
        assert placed["metadata"]["annotations"][keys.LAUNCHER_TEMPLATE_HASH_ANNOTATION] == hash_
        assert placed["metadata"]["annotations"][keys.LAUNCHER_CONFIG_HASH_ANNOTATION] == launcher_config_hash(
            hash_, node
        )
        assert placed["spec"]["nodeSelector"] == {"kubernetes.io/hostname": node}
    assert launcher_config_hash(hash_, "node-a") != launcher_config_hash(hash_, "node-b")
    assert keys.NODE_NAME_LABEL not in pod["metadata"]["labels"], "the node-independent Pod is not modified"


def test_the_runtime_class_knob_applies_where_the_template_names_none_and_is_outside_the_hash() -> None:
    """launcherRuntimeClassName (the chart) gives launchers e.g. `nvidia-legacy`; a LauncherConfig's own wins, and
    changing the knob makes no launcher stale."""
    pod, hash_ = node_independent_pod(config(), runtime_class="nvidia-legacy")
    assert pod["spec"]["runtimeClassName"] == "nvidia-legacy"
    assert hash_ == template_hash(config())
    own = config()
    own.spec.pod_template.spec["runtimeClassName"] = "nvidia"
    assert node_independent_pod(own, runtime_class="nvidia-legacy")[0]["spec"]["runtimeClassName"] == "nvidia"
    assert "runtimeClassName" not in node_independent_pod(config())[0]["spec"]


def test_the_launcher_container_gets_the_forced_environment_and_no_gpus() -> None:
    gpus = {"limits": {"nvidia.com/gpu": "8"}, "requests": {"nvidia.com/gpu": "8"}}
    pod, _ = node_independent_pod(config(env=[{"name": "VLLM_SERVER_DEV_MODE", "value": "0"}], resources=gpus))
    [container] = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "0"}, "requests": {"nvidia.com/gpu": "0"}}


def test_liveness_waits_for_the_launchers_first_answer_for_the_start_budget() -> None:
    """A launcher still preloading vLLM on a busy node (a minute, seen at load 10 on 2 cores) is not restarted
    before it ever serves: the kubelet runs liveness only after the startup probe's first success, which may
    take as long as the controller's launcher start budget."""
    pod, _ = node_independent_pod(config())
    [container] = pod["spec"]["containers"]
    startup, liveness = container["startupProbe"], container["livenessProbe"]
    assert startup["httpGet"] == liveness["httpGet"] == {"path": "/health", "port": keys.LAUNCHER_PORT}
    allowed = startup["periodSeconds"] * startup["failureThreshold"]
    liveness_alone = liveness["initialDelaySeconds"] + (liveness["failureThreshold"] - 1) * liveness["periodSeconds"]
    assert liveness_alone < 60 <= LAUNCHER_START_BUDGET.seconds <= allowed


def test_a_template_without_the_launcher_container_is_refused() -> None:
    lc = LauncherConfig.from_k8s(config_manifest(container="sidecar"))
    with pytest.raises(TemplateError, match="no container named 'inference-server'"):
        node_independent_pod(lc)


def test_a_template_go_cannot_read_is_refused_with_the_field() -> None:
    lc = config(ports=[{"containerPort": "8001"}])  # the CRD schema would refuse it; the hash must not crash
    with pytest.raises(TemplateError, match=r"containers\.ports\.containerPort: .*int32"):
        node_independent_pod(lc)
