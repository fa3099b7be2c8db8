"""The hashes FMA computes, byte for byte: instance IDs, launcher template and config hashes, direct-mode nominal
hashes (issue 13 item 3). A controller switch keeps launchers and sleeping instances only if both systems compute the
same values from the same objects.

The expected values in `fma_hash_vectors.json` come from FMA's own code paths (its provenance note says how they
were produced); each case also carries the exact bytes FMA hashed, so a mismatch shows where the encodings part.
"""

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from api import keys
from api.crdgen import kubernetes_definitions
from api.crds import InferenceServerConfig, LauncherConfig
from api.quantity import canonical_quantity
from controller.dualpods.identity import fma_model_server_config, instance_id
from controller.dualpods.nominal import base_pod, nominal_provider
from controller.launcher_template import launcher_config_hash, node_independent_pod
from gocompat import gojson, goyaml
from gocompat.go_template import render_server_patch
from gocompat.strategic_merge import apply_strategic_merge_patch, pod_schema

VECTORS: dict[str, Any] = json.loads((Path(__file__).parent / "fma_hash_vectors.json").read_text())


def by_name(cases: list[dict[str, Any]]) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("case", cases, ids=[c["name"] for c in cases])


def isc(model_server_config: dict[str, Any]) -> InferenceServerConfig:
    return InferenceServerConfig.from_k8s({
        "apiVersion": "fma.llm-d.ai/v1alpha1",
        "kind": "InferenceServerConfig",
        "metadata": {"name": "isc", "namespace": "ns"},
        "spec": {"launcherConfigName": "lc", "modelServerConfig": model_server_config},
    })  # fmt: skip


# ----- instance IDs


@by_name(VECTORS["instanceIDs"])
def test_the_model_server_config_yaml_is_gos(case: dict[str, Any]) -> None:
    assert goyaml.marshal(case["msc"]) == case["yaml"]


@by_name(VECTORS["instanceIDs"])
def test_the_instance_id_is_fmas(case: dict[str, Any]) -> None:
    config = isc(case["msc"])
    assert fma_model_server_config(config) == case["msc"]
    assert instance_id(config, case["gpus"]) == case["id"]


def test_our_extensions_never_give_an_fma_id() -> None:
    [typical] = [c for c in VECTORS["instanceIDs"] if c["name"] == "typical"]
    with_lora = copy.deepcopy(typical["msc"])
    spec = {"launcherConfigName": "lc", "modelServerConfig": with_lora, "loraAdapters": [{"name": "a", "path": "/a"}]}
    lora = InferenceServerConfig.from_k8s({**isc(with_lora).to_k8s(), "spec": spec})
    assert instance_id(isc(typical["msc"]), typical["gpus"]) == typical["id"]
    assert instance_id(isc(typical["msc"]), typical["gpus"], "transformers") != typical["id"]
    assert instance_id(lora, typical["gpus"]) != typical["id"]


# ----- launcher template and config hashes


@by_name(VECTORS["launcherTemplates"])
def test_the_launcher_template_hash_is_fmas(case: dict[str, Any]) -> None:
    lc = LauncherConfig.from_k8s({"apiVersion": "fma.llm-d.ai/v1alpha1", "kind": "LauncherConfig", **case["lc"]})
    pod, template_hash = node_independent_pod(lc, token_secret="launcher-token")
    assert template_hash == case["templateHash"], "the token volume we add is not part of the hash, as in FMA"
    assert pod["metadata"]["annotations"][keys.LAUNCHER_TEMPLATE_HASH_ANNOTATION] == case["templateHash"]
    for node, config_hash in case["configHashes"].items():
        assert launcher_config_hash(template_hash, node) == config_hash


@by_name(VECTORS["launcherTemplates"])
def test_the_hashed_template_bytes_are_gos(case: dict[str, Any]) -> None:
    """The Pod FMA hashes, as Go's typed encoder writes it (struct order, omitempty, canonical quantities)."""
    hashed = json.loads(case["templateJSON"])
    assert gojson.marshal(gojson.typed(hashed, "core.Pod"), sort_keys=False) == case["templateJSON"]


# ----- direct-mode nominal hashes


@by_name(VECTORS["nominal"])
def test_the_nominal_hash_is_fmas(case: dict[str, Any]) -> None:
    requester = copy.deepcopy(case["requester"])
    requester["metadata"]["annotations"][keys.SERVER_PATCH_ANNOTATION] = case["patch"]
    node = requester["spec"]["nodeName"]
    nominal = nominal_provider(requester, node, case["gpuIndices"].split(","), case["gpuUUIDs"].split(","))
    assert nominal.hash == case["hash"]
    assert nominal.pod["metadata"]["annotations"][keys.NOMINAL_ANNOTATION] == case["hash"]


@by_name(VECTORS["nominal"])
def test_the_hashed_nominal_bytes_are_gos(case: dict[str, Any]) -> None:
    """The merged Pod FMA hashes: the requester read as a Go Pod, merged, then a generic map (keys sorted, HTML
    escaped, numbers as float64)."""
    patch = render_server_patch(case["patch"], {"NodeName": case["requester"]["spec"]["nodeName"], "LocalVolume": ""})
    merged = apply_strategic_merge_patch(base_pod(case["requester"]), patch, pod_schema())
    assert gojson.marshal(merged) == case["modifiedJSON"]


# ----- the encodings' building blocks


@pytest.mark.parametrize("written", sorted(VECTORS["quantities"]))
def test_quantities_are_written_back_as_apimachinery_does(written: str) -> None:
    assert canonical_quantity(written) == VECTORS["quantities"][written]


@pytest.mark.parametrize(
    ("number", "go"),
    [(1.0, "1"), (0.1, "0.1"), (1e20, "100000000000000000000"), (1e21, "1e+21"), (1e-6, "0.000001"), (1e-7, "1e-7")],
)
def test_json_numbers_are_written_as_go_float64s(number: float, go: str) -> None:
    assert gojson.float64(number) == go


def test_json_strings_are_html_escaped_as_go_does() -> None:
    assert gojson.string('<a>&"\\\n\x01\u2028é\b') == '"\\u003ca\\u003e\\u0026\\"\\\\\\n\\u0001\\u2028é\\b"'


def test_a_go_type_rejects_a_value_of_the_wrong_kind() -> None:
    with pytest.raises(gojson.GoTypeError, match="int32"):
        gojson.typed({"containers": [{"name": "c", "ports": [{"containerPort": "80"}]}]}, "core.PodSpec")


def _properties(go_type: str, types: dict[str, Any]) -> set[str]:
    names: set[str] = set()
    for name, field_type, flags in types[go_type]:
        names |= _properties(field_type, types) if "i" in flags else {name}
    return names


def test_the_go_layout_names_exactly_the_openapi_properties() -> None:
    """pod_go_types.json (read from Go sources) and Kubernetes' OpenAPI agree on every struct's fields."""
    types = json.loads((Path(gojson.__file__).parent / gojson.POD_GO_TYPES).read_text())["types"]
    definitions = kubernetes_definitions()
    prefixes = {"core": "io.k8s.api.core.v1.", "meta": "io.k8s.apimachinery.pkg.apis.meta.v1."}
    checked = 0
    for go_type, layout in types.items():
        package, _, short = go_type.partition(".")
        definition = definitions.get(prefixes[package] + short)
        if not isinstance(layout, list) or definition is None or "properties" not in definition:
            continue
        assert _properties(go_type, types) == set(definition["properties"]), go_type
        checked += 1
    assert checked > 100
