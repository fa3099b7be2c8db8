"""Instance identity (fma.md §2.7) and an ISC's routing metadata checks (§2.7 "ISC routing metadata")."""

import base64
import hashlib
from typing import Any

import pytest

from api import keys
from api.crds import InferenceServerConfig
from api.labels import label_value_errors
from controller.dualpods.identity import instance_id, vllm_config
from controller.dualpods.routing import RoutingMetadata, from_isc, problems

GPUS = ["GPU-aaaa", "GPU-bbbb"]


def isc(name: str = "isc", **server: Any) -> InferenceServerConfig:
    model_server_config = {"port": 8005, "options": "--model /models/a --max-model-len 256", **server}
    return InferenceServerConfig.from_k8s({
        "apiVersion": "fma.llm-d.ai/v1alpha1",
        "kind": "InferenceServerConfig",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"launcherConfigName": "lc", "modelServerConfig": model_server_config},
    })  # fmt: skip


# ----- instance ID


def test_instance_id_follows_the_documented_formula() -> None:
    """ "I" + base64url, unpadded, of sha256(the model-server config as Go's YAML + ";gpus=" + UUIDs) + "i"."""
    config = "options: --model /models/a --max-model-len 256\nport: 8005\n"
    digest = hashlib.sha256(f"{config};gpus=GPU-aaaa,GPU-bbbb".encode()).digest()
    assert instance_id(isc(), GPUS) == "I" + base64.urlsafe_b64encode(digest).decode().rstrip("=") + "i"


def test_instance_id_is_stable_across_versions() -> None:
    """Pinned: a change here makes every sleeping instance in every cluster obsolete after an upgrade (and breaks
    interoperability with FMA: tests/test_fma_hashes.py checks FMA's own values)."""
    assert instance_id(isc(), GPUS) == "IMNLJ8dKdAi8NXa-RUnv3__GUbR23ZpEn3SB8UnTFOBwi"


def test_instance_id_is_a_valid_label_value() -> None:
    value = instance_id(isc(), GPUS)
    assert len(value) == 1 + 43 + 1  # sha256 is 32 bytes: 43 unpadded base64 characters
    assert label_value_errors(value) == []
    assert value.startswith("I")
    assert value.endswith("i")


def test_instance_id_is_deterministic() -> None:
    assert instance_id(isc(), GPUS) == instance_id(isc(), list(GPUS))


@pytest.mark.parametrize(
    "gpus", [["GPU-aaaa"], ["GPU-bbbb", "GPU-aaaa"], ["GPU-aaaa", "GPU-bbbb", "GPU-cccc"], []], ids=str
)
def test_instance_id_differs_per_gpu_set(gpus: list[str]) -> None:
    assert instance_id(isc(), gpus) != instance_id(isc(), GPUS)


@pytest.mark.parametrize(
    "change",
    [
        {"port": 8006},
        {"options": "--model /models/b --max-model-len 256"},
        {"env_vars": {"VLLM_LOGGING_LEVEL": "DEBUG"}},
        {"labels": {"example.com/pool": "a"}},
        {"annotations": {"example.com/note": "x"}},
    ],
    ids=lambda c: next(iter(c)),
)
def test_instance_id_differs_per_model_server_config(change: dict[str, Any]) -> None:
    assert instance_id(isc(**change), GPUS) != instance_id(isc(), GPUS)


def test_instance_id_ignores_the_isc_name_and_the_launcher() -> None:
    """The hot-start key is "the same model server on the same GPUs", whoever asks and wherever it is."""
    assert instance_id(isc("another-name"), GPUS) == instance_id(isc(), GPUS)


# ----- VllmConfig sent to the launcher


def test_vllm_config_carries_options_port_gpus_env_and_notes() -> None:
    config = vllm_config(isc(env_vars={"A": "1"}), GPUS)
    assert config.options == "--model /models/a --max-model-len 256 --port 8005"
    assert config.gpu_uuids == GPUS
    assert config.env_vars == {"A": "1"}
    assert config.annotations == {keys.INSTANCE_ISC_NAME: "isc", keys.INSTANCE_INFERENCE_PORT: "8005"}


def test_vllm_config_without_env_vars_omits_them() -> None:
    config = vllm_config(isc(), GPUS)
    assert config.env_vars is None
    assert "env_vars" not in config.model_dump(exclude_none=True)


def test_vllm_config_with_no_options_is_just_the_port() -> None:
    assert vllm_config(isc(options=""), GPUS).options == "--port 8005"


# ----- routing metadata


def test_routing_metadata_comes_from_the_model_server_config() -> None:
    routing = from_isc(isc(labels={"example.com/pool": "a"}, annotations={"example.com/note": "x y"}))
    assert routing == RoutingMetadata(labels={"example.com/pool": "a"}, annotations={"example.com/note": "x y"})
    assert RoutingMetadata.model_validate_json(routing.model_dump_json()) == routing


def test_valid_routing_metadata_has_no_problems() -> None:
    routing = RoutingMetadata(
        labels={"pool": "a", "example.com/pool": "a-1.b_2", "empty-value": ""},
        annotations={"example.com/note": 'any text at all: {"json": true}'},
    )
    assert problems(routing, {"app": "launcher"}, {"other": "x"}) == []


@pytest.mark.parametrize(
    "key",
    ["dual-pods.llm-d.ai/dual", "kubernetes.io/hostname", "k8s.io/x"],
)
@pytest.mark.parametrize("kind", ["label", "annotation"])
def test_reserved_prefixes_are_refused(kind: str, key: str) -> None:
    routing = RoutingMetadata(**{f"{kind}s": {key: "v"}})
    assert problems(routing, {}, {}) == [f"{kind} key {key!r} uses a reserved prefix"]


@pytest.mark.parametrize(
    "key",
    [
        "app.kubernetes.io/name",  # FMA reserves only the exact prefixes, not their subdomains
        "node.kubernetes.io/x",
        "a.b.k8s.io/x",
        "notkubernetes.io/x",
        "kubernetes.io.example.com/x",
        "example.com/kubernetes.io",
    ],
)
def test_lookalikes_and_subdomains_of_reserved_prefixes_are_allowed(key: str) -> None:
    assert problems(RoutingMetadata(labels={key: "v"}), {}, {}) == []


@pytest.mark.parametrize(
    "key", ["", "-starts-with-dash", "has space", "Upper.Example.com/x", "/no-prefix", "example.com/", "a" * 64]
)
@pytest.mark.parametrize("kind", ["label", "annotation"])
def test_keys_must_be_qualified_names(kind: str, key: str) -> None:
    found = problems(RoutingMetadata(**{f"{kind}s": {key: "v"}}), {}, {})
    assert found
    assert all(p.startswith(f"{kind} key {key!r}") for p in found)


@pytest.mark.parametrize("value", ["has space", "-dash-first", "a" * 64, "semi;colon"])
def test_label_values_must_be_valid(value: str) -> None:
    found = problems(RoutingMetadata(labels={"example.com/pool": value}), {}, {})
    assert len(found) == 1
    assert found[0].startswith(f"label 'example.com/pool' value {value!r}")


def test_annotation_values_are_free_text() -> None:
    assert problems(RoutingMetadata(annotations={"example.com/note": "has space; and -dash " * 10}), {}, {}) == []


@pytest.mark.parametrize("value", ["other", "same"])
def test_keys_must_not_collide_with_the_pods_labels(value: str) -> None:
    """Any collision, even with the same value: unbinding removes the ISC's keys, and would take the
    launcher's own label (e.g. from its LauncherConfig) with it."""
    found = problems(RoutingMetadata(labels={"example.com/pool": value}), {"example.com/pool": "same"}, {})
    assert found == ["label 'example.com/pool' is already on the Pod"]


@pytest.mark.parametrize("value", ["other", "same"])
def test_keys_must_not_collide_with_the_pods_annotations(value: str) -> None:
    found = problems(RoutingMetadata(annotations={"example.com/note": value}), {}, {"example.com/note": "same"})
    assert found == ["annotation 'example.com/note' is already on the Pod"]


def test_a_label_key_may_match_an_annotation_key() -> None:
    """Labels and annotations are separate maps."""
    routing = RoutingMetadata(labels={"example.com/x": "a"}, annotations={"example.com/x": "b"})
    assert problems(routing, {"app": "x"}, {"example.com/y": "z"}) == []


def test_every_problem_is_reported_at_once() -> None:
    routing = RoutingMetadata(labels={"kubernetes.io/x": "bad value", "ok": "fine"}, annotations={"k8s.io/y": "v"})
    assert len(problems(routing, {}, {})) == 3
