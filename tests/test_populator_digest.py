"""Policy digestion: a key's target is the largest count among the policies that select its Node and
name its LauncherConfig, 0 when none does, hands-off while the LauncherConfig is missing or malformed;
the digest says which keys and policies a change affects, and what the policies' statuses report.
(Selector matching itself is tested in tests/test_crds.py.)"""

import dataclasses
from typing import Any
from unittest.mock import ANY

from controller.conditions import Fault
from controller.populator.digest import Digest, Target, digest_config, digest_policy
from controller.populator.key import LauncherKey
from controller.populator.nodes import NodeFacts
from tests.test_populator_fakes import config_manifest, node, policy_manifest

GPU = {"nvidia.com/gpu.present": "true"}


def gpu_policy(counts: dict[str, int], **allocatable: dict[str, Any]) -> dict[str, Any]:
    manifest = policy_manifest(counts, GPU)
    manifest["spec"]["enhancedNodeSelector"]["allocatableResources"] = allocatable
    return manifest


def digest_of(*policies: dict[str, Any], configs: tuple[str, ...] = ("a", "b")) -> Digest:
    digest = Digest()
    digest.set_node("gpu-8", node("gpu-8", GPU, **{"nvidia.com/gpu": "8"}))
    digest.set_node("gpu-2", node("gpu-2", GPU, **{"nvidia.com/gpu": "2"}))
    digest.set_node("cpu", node("cpu"))
    for name in configs:
        digest.set_config(name, digest_config(config_manifest(name), None))
    for index, manifest in enumerate(policies):
        digest.set_policy(f"p{index}", digest_policy(manifest))
    return digest


def counts(digest: Digest, config: str) -> dict[str, int | None]:
    return {n: (t.count if (t := digest.target(LauncherKey(n, config))) else None) for n in ("gpu-8", "gpu-2", "cpu")}


def test_the_target_is_the_largest_count_among_the_policies_that_select_the_node() -> None:
    digest = digest_of(
        gpu_policy({"a": 1, "b": 3}),
        gpu_policy({"a": 4}, **{"nvidia.com/gpu": {"min": 8}}),
        gpu_policy({"a": 2}, **{"nvidia.com/gpu": {"max": 4}}),
    )
    assert counts(digest, "a") == {"gpu-8": 4, "gpu-2": 2, "cpu": 0}
    assert counts(digest, "b") == {"gpu-8": 3, "gpu-2": 3, "cpu": 0}


def _slice(driver: str, pool: str, generation: int, devices: int) -> dict[str, Any]:
    devices_ = [{"name": f"gpu-{i}"} for i in range(devices)]
    return {
        "spec": {
            "driver": driver,
            "nodeName": "dra",
            "pool": {"name": pool, "generation": generation},
            "devices": devices_,
        }
    }


def test_dra_nodes_are_selected_by_the_devices_their_driver_publishes() -> None:
    """A DRA Node has no `nvidia.com/gpu` allocatable; its ResourceSlices say how many GPUs it has. A pool's
    slices of an older generation are being replaced and do not count."""
    slices = [
        _slice("gpu.nvidia.com", "dra", 1, 4),
        _slice("gpu.nvidia.com", "dra", 0, 8),  # stale
        _slice("gpu.nvidia.com", "other-pool", 0, 4),
        _slice("net.example.com", "dra", 0, 2),
    ]
    facts = NodeFacts.from_k8s({"metadata": {"name": "dra", "labels": GPU}, "status": {"allocatable": {}}}, slices)
    assert facts.dra_devices == {"gpu.nvidia.com": 8, "net.example.com": 2}
    digest = digest_of(gpu_policy({"a": 1}, **{"nvidia.com/gpu": {"min": 1}}))
    dra_policy = policy_manifest({"b": 2}, GPU)
    dra_policy["spec"]["enhancedNodeSelector"]["draDevices"] = {"gpu.nvidia.com": {"min": 8}}
    digest.set_policy("dra", digest_policy(dra_policy))
    assert digest.set_node("dra", facts) == {LauncherKey("dra", "b")}
    assert digest.policy_asks("dra") == {LauncherKey("dra", "b"): 2}
    assert digest.target(LauncherKey("dra", "a")).count == 0  # type: ignore[union-attr]
    # Its driver gone (a device-plugin Node again, say): no longer selected.
    assert digest.set_node("dra", NodeFacts.from_k8s({"metadata": {"name": "dra", "labels": GPU}})) == {
        LauncherKey("dra", "b")
    }
    assert digest.policy_asks("dra") == {}


def test_a_negative_count_asks_for_none() -> None:
    assert counts(digest_of(gpu_policy({"a": -3})), "a") == {"gpu-8": 0, "gpu-2": 0, "cpu": 0}


def test_hands_off_while_the_launcher_config_is_missing_or_malformed() -> None:
    digest = digest_of(gpu_policy({"a": 1, "b": 1, "ghost": 1}))
    digest.set_config("b", digest_config(config_manifest("b", container="sidecar"), None))
    assert counts(digest, "ghost") == {"gpu-8": None, "gpu-2": None, "cpu": None}
    assert counts(digest, "b") == {"gpu-8": None, "gpu-2": None, "cpu": None}
    assert digest.config_error("b") == "LauncherConfig b: podTemplate.spec has no container named 'inference-server'"
    target = digest.target(LauncherKey("gpu-8", "a"))
    assert target is not None
    assert target.template["metadata"]["annotations"]["dual-pods.llm-d.ai/launcher-populator-template-hash"] == (
        target.template_hash
    )


def test_a_launcher_config_the_models_refuse_is_malformed_too() -> None:
    manifest = config_manifest("a")
    manifest["spec"]["maxInstances"] = 0
    digest = digest_config(manifest, None)
    assert digest.template is None
    assert digest.error == "LauncherConfig a: spec.maxInstances: Input should be greater than or equal to 1"


def test_policy_errors_name_their_unusable_launcher_configs_and_their_own_problems() -> None:
    bad = policy_manifest({"ghost": 1, "a": 1, "b": 1})
    bad["spec"]["enhancedNodeSelector"]["labelSelector"] = {
        "matchExpressions": [{"key": "zone", "operator": "Sometimes", "values": ["x"]}]
    }
    digest = digest_of(bad)
    digest.set_config("b", digest_config(config_manifest("b", container="sidecar"), None))
    [selector_error, *references] = digest.policy_problems("p0")
    assert selector_error.reason == "InvalidSpec"
    assert selector_error.message.startswith(
        "invalid enhancedNodeSelector: labelSelector.matchExpressions.0.operator: "
    )
    assert references == [
        Fault("LauncherConfigNotFound", 'LauncherConfig "ghost" referenced in CountForLauncher does not exist'),
        Fault(
            "LauncherConfigInvalid",
            'LauncherConfig "b" referenced in CountForLauncher is malformed: '
            "LauncherConfig b: podTemplate.spec has no container named 'inference-server'",
        ),
    ]
    assert counts(digest, "a") == {"gpu-8": 0, "gpu-2": 0, "cpu": 0}, "an unparseable selector selects no Node"


def test_policy_and_node_changes_return_exactly_the_keys_whose_target_changed() -> None:
    digest = digest_of()
    assert digest.set_policy("p", digest_policy(gpu_policy({"a": 1}))) == {
        LauncherKey("gpu-8", "a"),
        LauncherKey("gpu-2", "a"),
    }
    assert digest.set_policy("q", digest_policy(gpu_policy({"a": 1, "b": 2}))) == {
        LauncherKey("gpu-8", "b"),
        LauncherKey("gpu-2", "b"),
    }
    assert digest.set_node("cpu", node("cpu", {**GPU, "zone": "x"})) == {
        LauncherKey("cpu", "a"),
        LauncherKey("cpu", "b"),
    }
    assert digest.set_node("cpu", node("cpu", {**GPU, "zone": "y"})) == set()
    assert digest.set_node("gpu-2", None) == {LauncherKey("gpu-2", "a"), LauncherKey("gpu-2", "b")}
    assert digest.set_policy("q", None) == {LauncherKey("gpu-8", "b"), LauncherKey("cpu", "b")}
    assert digest.keys_for_config("a") == {LauncherKey("gpu-8", "a"), LauncherKey("cpu", "a")}
    assert digest.policies_naming("a") == ["p"]


def test_cordoning_a_node_returns_its_keys_flags_their_targets_and_takes_it_out_of_the_policies_asks() -> None:
    digest = digest_of(gpu_policy({"a": 1, "b": 2}))
    cordoned = dataclasses.replace(node("gpu-2", GPU, **{"nvidia.com/gpu": "2"}), cordoned=True)
    assert digest.set_node("gpu-2", cordoned) == {LauncherKey("gpu-2", "a"), LauncherKey("gpu-2", "b")}
    assert digest.target(LauncherKey("gpu-2", "b")) == Target(2, ANY, ANY, cordoned=True), "its count stays"
    assert digest.target(LauncherKey("gpu-8", "b")) == Target(2, ANY, ANY, cordoned=False)
    assert digest.policy_asks("p0") == {LauncherKey("gpu-8", "a"): 1, LauncherKey("gpu-8", "b"): 2}
    assert digest.set_node("gpu-2", cordoned) == set()
    assert digest.set_node("gpu-2", dataclasses.replace(cordoned, cordoned=False)) == {
        LauncherKey("gpu-2", "a"),
        LauncherKey("gpu-2", "b"),
    }
    assert LauncherKey("gpu-2", "b") in digest.policy_asks("p0")


def test_a_launcher_config_change_matters_when_it_appears_goes_or_changes_validity_or_template() -> None:
    digest = Digest()
    good = digest_config(config_manifest("a"), None)
    assert digest.set_config("a", good)
    assert not digest.set_config("a", digest_config(config_manifest("a"), None)), "same template"
    changed = config_manifest("a")
    changed["spec"]["podTemplate"]["metadata"] = {"labels": {"rev": "2"}}
    assert digest.set_config("a", digest_config(changed, None))
    assert not digest.set_config("a", digest_config(changed, None))
    assert digest.set_config("a", digest_config(config_manifest("a", container="sidecar"), None))
    assert digest.set_config("a", None)
    assert not digest.set_config("a", None)


def test_node_facts_ignore_what_policies_cannot_select_on() -> None:
    def node_object(heartbeat: str, gpus: str = "8") -> dict[str, Any]:
        return {
            "metadata": {"name": "n", "labels": GPU, "resourceVersion": heartbeat},
            "status": {"allocatable": {"nvidia.com/gpu": gpus}, "conditions": [{"lastHeartbeatTime": heartbeat}]},
        }

    assert NodeFacts.from_k8s(node_object("1")) == NodeFacts.from_k8s(node_object("2"))
    assert NodeFacts.from_k8s(node_object("1")) != NodeFacts.from_k8s(node_object("1", gpus="4"))
    cordoned = node_object("1") | {"spec": {"unschedulable": True}}
    assert NodeFacts.from_k8s(cordoned).cordoned
    assert not NodeFacts.from_k8s(node_object("1")).cordoned


def test_a_policy_asks_its_count_of_each_launcher_config_on_each_node_it_selects() -> None:
    digest = digest_of(gpu_policy({"a": 2, "b": 0}, **{"nvidia.com/gpu": {"min": 8}}), policy_manifest({"a": 1}))
    assert digest.policy_asks("p0") == {LauncherKey("gpu-8", "a"): 2, LauncherKey("gpu-8", "b"): 0}
    assert digest.policy_asks("p1") == {LauncherKey(n, "a"): 1 for n in ("gpu-8", "gpu-2", "cpu")}
