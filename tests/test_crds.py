"""The CRD models (api/crds.py), their generated YAML (config/crd/), quantities and Node selection."""

import copy
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from api import crdgen
from api.crds import (
    API_VERSION,
    InferenceServerConfig,
    InferenceServerConfigStatus,
    LauncherConfig,
    LauncherPopulationPolicy,
    parse_object,
)
from api.quantity import Quantity, parse_quantity
from api.selectors import EnhancedNodeSelector, LabelSelector
from api.structural import KEPT_KEYS, SchemaError, StructuralConverter
from e2e.crds import EXAMPLES, FIXTURES, manifests


def examples() -> list[dict[str, Any]]:
    """FMA's e2e objects (e2e/fixture_manifests/), the ones the tests below look into."""
    return manifests(FIXTURES)


def example(kind: str, name: str) -> dict[str, Any]:
    return copy.deepcopy(next(d for d in examples() if d["kind"] == kind and d["metadata"]["name"] == name))


# --- generated CRDs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("committed_dir", crdgen.DEFAULT_OUT_DIRS, ids=lambda d: d.parent.name)
def test_committed_crds_match_the_models(tmp_path: Path, committed_dir: Path) -> None:
    """In config/crd/ and in the chart, as real files (not symbolic links, which Flux does not follow)."""
    assert crdgen.main(["crdgen", str(tmp_path)]) == 0
    generated = {p.name: p.read_text() for p in tmp_path.iterdir()}
    committed = {p.name: p.read_text() for p in committed_dir.glob("*.yaml")}
    stale = sorted(name for name in generated.keys() | committed.keys() if generated.get(name) != committed.get(name))
    assert not stale, f"{committed_dir} is out of date with api/ ({', '.join(stale)}): run `python -m api.crdgen`"
    assert not [p for p in committed_dir.iterdir() if p.is_symlink()]


def _schema_nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _schema_nodes(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from _schema_nodes(schema[key], f"{path}[]")


@pytest.fixture(scope="module")
def crds() -> dict[str, dict[str, Any]]:
    return {d["spec"]["names"]["kind"]: d for d in map(yaml.safe_load, crdgen.render().values())}


def _schema(crd: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_crd_schemas_are_structural(crds: dict[str, dict[str, Any]]) -> None:
    """Every node typed (or int-or-string), and only keys apiextensions.k8s.io/v1 knows."""
    allowed = {"properties", "items", "additionalProperties", "anyOf", "default", *KEPT_KEYS}
    for kind, crd in crds.items():
        for path, node in _schema_nodes(_schema(crd)):
            assert "type" in node or node.get("x-kubernetes-int-or-string"), f"{kind}{path} has no type"
            assert set(node) <= allowed, f"{kind}{path} has {set(node) - allowed}"


def test_crd_names_columns_and_subresources(crds: dict[str, dict[str, Any]]) -> None:
    short = {kind: crd["spec"]["names"]["shortNames"] for kind, crd in crds.items()}
    assert short == {"InferenceServerConfig": ["isc"], "LauncherConfig": ["lcfg"], "LauncherPopulationPolicy": ["lpp"]}
    for crd in crds.values():
        version = crd["spec"]["versions"][0]
        assert (crd["spec"]["group"], version["name"], crd["spec"]["scope"]) == (
            "fma.llm-d.ai",
            "v1alpha1",
            "Namespaced",
        )
        assert version["subresources"] == {"status": {}}
        assert version["additionalPrinterColumns"][-1]["name"] == "Age"
    counts = _schema(crds["LauncherPopulationPolicy"])["properties"]["spec"]["properties"]["countForLauncher"]
    assert counts["x-kubernetes-list-type"] == "map"
    assert counts["x-kubernetes-list-map-keys"] == ["launcherConfigName"]


def test_columns_show_readiness_errors_and_served_requesters(crds: dict[str, dict[str, Any]]) -> None:
    """`kubectl get isc` shows Ready, how many requesters it serves and the error; the others Ready and the error."""
    columns = {kind: {c["name"]: c["jsonPath"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]
                      if not c.get("priority")} for kind, crd in crds.items()}  # fmt: skip
    for kind in columns:
        assert columns[kind]["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
        assert columns[kind]["Error"] == '.status.conditions[?(@.type=="Stalled")].message'
    assert columns["InferenceServerConfig"]["Requesters"] == ".status.servedRequesters"
    for crd in crds.values():
        status = _schema(crd)["properties"]["status"]["properties"]
        conditions = status["conditions"]
        assert (conditions["x-kubernetes-list-type"], conditions["x-kubernetes-list-map-keys"]) == ("map", ["type"])
        condition = conditions["items"]
        # metav1.Condition's, but `message`: the API server reads an empty one as null, so it is left out.
        assert condition["required"] == ["type", "status", "lastTransitionTime", "reason"]
        assert condition["properties"]["status"]["enum"] == ["True", "False", "Unknown"]
        assert condition["properties"]["lastTransitionTime"]["format"] == "date-time"
        assert status["observedGeneration"]["type"] == "integer"
    count = _schema(crds["LauncherPopulationPolicy"])["properties"]["spec"]["properties"]["countForLauncher"]
    assert count["items"]["properties"]["launcherCount"]["minimum"] == 0


def test_launcher_config_embeds_the_kubernetes_pod_spec(crds: dict[str, dict[str, Any]]) -> None:
    template = _schema(crds["LauncherConfig"])["properties"]["spec"]["properties"]["podTemplate"]["properties"]
    assert set(template["metadata"]["properties"]) == {"labels", "annotations"}
    pod = template["spec"]
    assert pod["required"] == ["containers"]
    container = pod["properties"]["containers"]["items"]["properties"]
    assert container["ports"]["items"]["properties"]["protocol"]["default"] == "TCP"
    assert container["livenessProbe"]["properties"]["httpGet"]["properties"]["port"]["x-kubernetes-int-or-string"]
    limits = container["resources"]["properties"]["limits"]["additionalProperties"]
    assert limits["x-kubernetes-int-or-string"]
    assert "pattern" in limits
    # The one list-map whose key Kubernetes defaults to "" (which the 1.20 API server refused) is atomic instead.
    assert pod["properties"]["imagePullSecrets"]["x-kubernetes-list-type"] == "atomic"


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}}, "recursive model A"),
        ({"type": "object", "additionalProperties": True}, "unsupported schema key 'additionalProperties'"),
        ({"anyOf": [{"type": "integer"}, {"type": "boolean"}]}, "cannot express the union"),
        ({"description": "untyped"}, "needs a type"),
        ({"type": ["string", "integer"]}, "cannot express type"),
    ],
)
def test_schemas_a_crd_cannot_express_are_refused(schema: dict[str, Any], message: str) -> None:
    definitions = {"A": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}}}
    with pytest.raises(SchemaError, match=message):
        StructuralConverter({}, kubernetes_descriptions=False).convert(schema, definitions)


# --- the models on FMA's manifests ------------------------------------------------------------------


def test_examples_cover_every_kind() -> None:
    kinds = [doc["kind"] for doc in examples()]
    assert kinds.count("InferenceServerConfig") == 3
    assert {"LauncherConfig", "LauncherPopulationPolicy"} <= set(kinds)


@pytest.mark.parametrize(
    "manifest", examples() + manifests(EXAMPLES), ids=lambda d: f"{d['kind']}-{d['metadata']['name']}"
)
def test_examples_parse_and_dump_back_unchanged(manifest: dict[str, Any]) -> None:
    assert parse_object(manifest).to_k8s() == manifest


def test_parsed_examples_expose_fma_fields() -> None:
    ports = sorted(
        InferenceServerConfig.from_k8s(d).spec.model_server_config.port
        for d in examples()
        if d["kind"] == "InferenceServerConfig"
    )
    assert ports == [8005, 8006, 8007]
    smol = InferenceServerConfig.from_k8s(example("InferenceServerConfig", "smol"))
    assert smol.spec.launcher_config_name == "cpu-launcher"
    assert smol.spec.model_server_config.env_vars["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert smol.spec.model_server_config.labels == {"e2e-test.fma.llm-d.ai/isc-label": "test-value"}
    launcher = LauncherConfig.from_k8s(example("LauncherConfig", "cpu-launcher"))
    assert launcher.spec.max_instances == 2
    assert launcher.spec.pod_template.metadata.labels == {
        "e2e-test.fma.llm-d.ai/template-label": "from-launcher-config"
    }
    assert launcher.spec.pod_template.spec["containers"][0]["name"] == "inference-server"
    assert launcher.spec.sleeper_budget.host_memory_bytes is None
    budget = LauncherConfig.from_k8s(example("LauncherConfig", "gpu-launcher")).spec.sleeper_budget
    assert budget.host_memory_bytes == Quantity("64Gi")
    assert budget.gpu_memory_bytes == 6 * 2**30
    policy = LauncherPopulationPolicy.from_k8s(example("LauncherPopulationPolicy", "one-launcher-per-gpu-node"))
    assert [(c.launcher_config_name, c.launcher_count) for c in policy.spec.count_for_launcher] == [("cpu-launcher", 1)]
    assert policy.spec.enhanced_node_selector.matches({"nvidia.com/gpu.present": "true"}, {})
    assert not policy.spec.enhanced_node_selector.matches({"nvidia.com/gpu.present": "false"}, {})


def test_status_and_server_fields_round_trip() -> None:
    manifest = example("InferenceServerConfig", "qwen")
    manifest["metadata"] |= {"namespace": "ns", "uid": "u-1", "resourceVersion": "7", "generation": 3}
    manifest["metadata"]["managedFields"] = [{"manager": "kubectl", "operation": "Update"}]
    error = 'LauncherConfig "x" does not exist'
    manifest["status"] = {
        "observedGeneration": 3,
        "errors": [error],
        "conditions": [
            {"type": "Ready", "status": "False", "observedGeneration": 3, "lastTransitionTime": "2026-01-02T03:04:05Z",
             "reason": "LauncherConfigNotFound", "message": error},
            {"type": "Stalled", "status": "True", "observedGeneration": 3, "lastTransitionTime": "2026-01-02T03:04:05Z",
             "reason": "LauncherConfigNotFound", "message": error},
        ],
        "servedRequesters": 2,
    }  # fmt: skip
    parsed = InferenceServerConfig.from_k8s(manifest)
    assert (parsed.metadata.generation, parsed.status.observed_generation) == (3, 3)
    stalled = parsed.status.condition("Stalled")
    assert stalled is not None
    assert (stalled.status, stalled.reason, stalled.message) == ("True", "LauncherConfigNotFound", error)
    assert parsed.status.condition("Other") is None
    assert parsed.to_k8s() == manifest
    parsed.status = InferenceServerConfigStatus()
    assert "status" not in parsed.to_k8s()


def test_objects_built_in_python_dump_as_kubernetes_json() -> None:
    isc = InferenceServerConfig.model_validate(
        {"metadata": {"name": "a"}, "spec": {"launcher_config_name": "lc", "model_server_config": {"port": 9000}}}
    )
    assert isc.to_k8s() == {
        "apiVersion": API_VERSION,
        "kind": "InferenceServerConfig",
        "metadata": {"name": "a"},
        "spec": {"launcherConfigName": "lc", "modelServerConfig": {"port": 9000}},
    }


def _isc(**server: Any) -> dict[str, Any]:
    return {"kind": "InferenceServerConfig", "spec": {"launcherConfigName": "lc", "modelServerConfig": server}}


def _lc(**spec: Any) -> dict[str, Any]:
    return {"kind": "LauncherConfig", "spec": spec}


def _lpp(**spec: Any) -> dict[str, Any]:
    base = {
        "enhancedNodeSelector": {"labelSelector": {}},
        "countForLauncher": [{"launcherConfigName": "a", "launcherCount": 1}],
    }
    return {"kind": "LauncherPopulationPolicy", "spec": {**base, **spec}}


@pytest.mark.parametrize(
    ("manifest", "location", "message"),
    [
        (_isc(port=0), "spec.modelServerConfig.port", "greater than or equal to 1"),
        (_isc(port=65536), "spec.modelServerConfig.port", "less than or equal to 65535"),
        (_isc(port="8005"), "spec.modelServerConfig.port", "valid integer"),
        (_isc(port=8005, env_vars={"A": 1}), "spec.modelServerConfig.env_vars.A", "valid string"),
        (_isc(), "spec.modelServerConfig.port", "Field required"),
        (
            {"kind": "InferenceServerConfig", "spec": {"modelServerConfig": {"port": 1}}},
            "spec.launcherConfigName",
            "Field required",
        ),
        (
            {"kind": "InferenceServerConfig", "spec": {"launcherConfigName": "lc"}},
            "spec.modelServerConfig",
            "Field required",
        ),
        ({"kind": "InferenceServerConfig", "metadata": {"name": "x"}}, "spec", "Field required"),
        (_lc(maxInstances=0), "spec.maxInstances", "greater than or equal to 1"),
        (_lc(maxInstances=2**31), "spec.maxInstances", "less than or equal to 2147483647"),
        (_lc(), "spec.maxInstances", "Field required"),
        (
            _lc(maxInstances=1, sleeperBudget={"hostMemoryBytes": "-1Gi"}),
            "spec.sleeperBudget.hostMemoryBytes",
            "negative",
        ),
        (
            _lc(maxInstances=1, sleeperBudget={"gpuMemoryBytes": "6 GiB"}),
            "spec.sleeperBudget.gpuMemoryBytes",
            "not a Kubernetes quantity",
        ),
        (
            _lc(maxInstances=1, sleeperBudget={"gpuMemoryBytes": 1.5}),
            "spec.sleeperBudget.gpuMemoryBytes",
            "integer or a string",
        ),
        (
            _lpp(countForLauncher=[{"launcherConfigName": "a", "launcherCount": 1}] * 2),
            "spec.countForLauncher",
            "listed more than once: a",
        ),
        (
            _lpp(countForLauncher=[{"launcherConfigName": "a"}]),
            "spec.countForLauncher.0.launcherCount",
            "Field required",
        ),
        (
            _lpp(countForLauncher=[{"launcherConfigName": "a", "launcherCount": -1}]),
            "spec.countForLauncher.0.launcherCount",
            "greater than or equal to 0",
        ),
        (
            {
                **_lc(maxInstances=1),
                "status": {
                    "conditions": [
                        {"type": "Ready", "status": "Yes", "reason": "R", "message": "", "lastTransitionTime": "t"}
                    ]
                },
            },
            "status.conditions.0.status",
            "'True', 'False' or 'Unknown'",
        ),
        (
            {
                **_lc(maxInstances=1),
                "status": {
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "not one",
                            "message": "",
                            "lastTransitionTime": "t",
                        }
                    ]
                },
            },
            "status.conditions.0.reason",
            "should match pattern",
        ),
        (_lpp(enhancedNodeSelector={}), "spec.enhancedNodeSelector.labelSelector", "Field required"),
        (
            {"kind": "LauncherPopulationPolicy", "spec": {"enhancedNodeSelector": {"labelSelector": {}}}},
            "spec.countForLauncher",
            "Field required",
        ),
        (
            _lpp(enhancedNodeSelector={"labelSelector": {}, "allocatableResources": {"memory": {"min": "lots"}}}),
            "spec.enhancedNodeSelector.allocatableResources.memory.min",
            "not a Kubernetes quantity",
        ),
    ],
)
def test_bad_manifests_are_rejected_with_the_field_and_reason(
    manifest: dict[str, Any], location: str, message: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_object(manifest)
    errors = {".".join(map(str, e["loc"])): e["msg"] for e in caught.value.errors()}
    assert location in errors, errors
    assert message in errors[location]


def test_objects_of_other_kinds_or_groups_are_refused() -> None:
    with pytest.raises(ValueError, match="kind 'Pod' is none of"):
        parse_object({"kind": "Pod", "apiVersion": "v1"})
    wrong_group = {**_lc(maxInstances=1), "apiVersion": "llmd.ai/v1alpha1"}
    with pytest.raises(ValidationError, match=r"apiVersion is 'llmd\.ai/v1alpha1', expected 'fma\.llm-d\.ai/v1alpha1'"):
        parse_object(wrong_group)
    with pytest.raises(ValidationError, match="kind is 'LauncherConfig', expected 'InferenceServerConfig'"):
        InferenceServerConfig.from_k8s(_lc(maxInstances=1))


# --- quantities -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1Gi", Fraction(2**30)),
        ("500m", Fraction(1, 2)),
        ("2", Fraction(2)),
        ("1e3", Fraction(1000)),
        ("1E", Fraction(10**18)),  # exa, not an exponent
        ("1.5Ki", Fraction(1536)),
        ("+.5", Fraction(1, 2)),
        ("5.", Fraction(5)),
        ("-1.5M", Fraction(-1_500_000)),
        ("2e-3", Fraction(2, 1000)),
        ("12n", Fraction(12, 10**9)),
        ("100u", Fraction(1, 10**4)),
        ("32Gi", Fraction(32 * 2**30)),
    ],
)
def test_quantities_parse_exactly(text: str, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "1 Gi", "1ki", "1e", "1e1.5", "1.2.3", "0x10", "1Gi\n", "--1", "1e1001"])
def test_malformed_quantities_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"quantity|exponent"):
        parse_quantity(text)


def test_quantities_compare_by_value_and_keep_their_spelling() -> None:
    assert Quantity("1Ki") == Quantity(1024) == 1024
    assert Quantity("1k") < Quantity("1Ki") < 2000
    assert sorted([Quantity("1Gi"), Quantity(5), Quantity("100m")]) == [Quantity("100m"), Quantity(5), Quantity("1Gi")]
    assert (Quantity("1.5").raw, int(Quantity("1.5")), int(Quantity("100m"))) == ("1.5", 2, 1)  # Value() rounds up
    assert len({Quantity("1Ki"), Quantity(1024)}) == 1
    with pytest.raises(TypeError):
        Quantity(True)


# --- Node selection ---------------------------------------------------------------------------------

GPU_NODE = {"nvidia.com/gpu": "8", "cpu": "96", "memory": "512Gi"}


def _resources(ranges: dict[str, Any]) -> EnhancedNodeSelector:
    return EnhancedNodeSelector.model_validate({"labelSelector": {}, "allocatableResources": ranges})


# FMA's node-matcher_test.go table: empty, missing resource, below min, above max, within, = min, = max, multiple.
@pytest.mark.parametrize(
    ("ranges", "matches"),
    [
        ({}, True),
        ({"example.com/fpga": {"min": 1}}, False),
        ({"nvidia.com/gpu": {"min": 16}}, False),
        ({"nvidia.com/gpu": {"max": "4"}}, False),
        ({"nvidia.com/gpu": {"min": 4, "max": 16}}, True),
        ({"nvidia.com/gpu": {"min": 8}}, True),
        ({"memory": {"max": "512Gi"}}, True),
        (
            {"nvidia.com/gpu": {"min": 8, "max": 8}, "cpu": {"min": "16", "max": "128"}, "memory": {"min": "128Gi"}},
            True,
        ),
    ],
    ids=["empty", "missing-resource", "below-min", "above-max", "within", "equal-min", "equal-max", "multiple"],
)
def test_allocatable_ranges(ranges: dict[str, Any], matches: bool) -> None:
    assert _resources(ranges).matches({}, GPU_NODE) is matches


def test_a_node_must_satisfy_every_range_and_the_labels() -> None:
    assert not _resources({"nvidia.com/gpu": {"min": 8}, "memory": {"min": "1Ti"}}).matches({}, GPU_NODE)
    both = EnhancedNodeSelector.model_validate(
        {"labelSelector": {"matchLabels": {"gpu": "yes"}}, "allocatableResources": {"cpu": {"min": "500m"}}}
    )
    assert both.matches({"gpu": "yes"}, {"cpu": "1"})
    assert not both.matches({"gpu": "no"}, {"cpu": "1"})
    assert not both.matches({"gpu": "yes"}, {"cpu": "100m"})


def test_dra_device_ranges_need_the_driver_to_publish_devices() -> None:
    selector = EnhancedNodeSelector.model_validate({"labelSelector": {}, "draDevices": {"gpu.nvidia.com": {"min": 2}}})
    assert selector.matches({}, {}, {"gpu.nvidia.com": 2})
    assert not selector.matches({}, {}, {"gpu.nvidia.com": 1})
    assert not selector.matches({}, GPU_NODE, {}), "a device-plugin Node"
    anything = EnhancedNodeSelector.model_validate({"labelSelector": {}, "draDevices": {"gpu.nvidia.com": {}}})
    assert anything.matches({}, {}, {"gpu.nvidia.com": 1})
    assert not anything.matches({}, {}, {"gpu.nvidia.com": 0})


LABELS = {"nvidia.com/gpu.present": "true", "node.kubernetes.io/instance-type": "gx3-48x240x2l40s", "zone": "a"}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ({}, True),
        ({"matchLabels": {"nvidia.com/gpu.present": "true"}}, True),
        ({"matchLabels": {"nvidia.com/gpu.present": "true", "zone": "b"}}, False),
        (
            {
                "matchExpressions": [
                    {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["gx3-48x240x2l40s", "x"]}
                ]
            },
            True,
        ),
        ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b", "c"]}]}, False),
        ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["b"]}]}, True),
        ({"matchExpressions": [{"key": "rack", "operator": "NotIn", "values": ["r1"]}]}, True),  # absent label
        ({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}, True),
        ({"matchExpressions": [{"key": "rack", "operator": "Exists"}]}, False),
        ({"matchExpressions": [{"key": "rack", "operator": "DoesNotExist"}]}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, False),
        ({"matchLabels": {"zone": "a"}, "matchExpressions": [{"key": "rack", "operator": "Exists"}]}, False),
    ],
)
def test_label_selectors(selector: dict[str, Any], matches: bool) -> None:
    assert LabelSelector.model_validate(selector).matches(LABELS) is matches


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ({"matchExpressions": [{"key": "zone", "operator": "In", "values": []}]}, "needs at least one value"),
        ({"matchExpressions": [{"key": "zone", "operator": "Exists", "values": ["a"]}]}, "takes no values"),
        (
            {"matchExpressions": [{"key": "zone", "operator": "Gt", "values": ["1"]}]},
            "'In', 'NotIn', 'Exists' or 'DoesNotExist'",
        ),
        ({"matchLabels": {"bad key!": "x"}}, "invalid label key 'bad key!'"),
        ({"matchLabels": {"Example.com/a": "x"}}, "prefix part must be a lowercase DNS subdomain"),
        ({"matchLabels": {"zone": "-a"}}, "invalid label value '-a'"),
        ({"matchExpressions": [{"key": "/zone", "operator": "Exists"}]}, "prefix part must be non-empty"),
    ],
)
def test_invalid_label_selectors_are_refused(selector: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        LabelSelector.model_validate(selector)


def test_a_population_policy_without_a_spec_is_valid_and_asks_for_nothing(crds: dict[str, dict[str, Any]]) -> None:
    """As in FMA, whose LauncherPopulationPolicy CRD does not require `spec` (Go's zero spec selects every Node for no
    LauncherConfig); the other two kinds still require theirs."""
    required = {name: _schema(crd).get("required", []) for name, crd in crds.items()}
    assert {name: "spec" in fields for name, fields in required.items()} == {
        "InferenceServerConfig": True,
        "LauncherConfig": True,
        "LauncherPopulationPolicy": False,
    }
    policy = LauncherPopulationPolicy.from_k8s({k: v for k, v in _lpp().items() if k != "spec"})
    assert policy.spec.count_for_launcher == []
    assert policy.spec.enhanced_node_selector.matches({"any": "node"}, {})


def test_the_models_parse_what_only_the_crds_bounds_refuse(crds: dict[str, dict[str, Any]]) -> None:
    """An InferenceServerConfig stored before the CRD bounded its routing maps still parses, so the controllers can
    say what is wrong with it rather than fail to read it; the CRD carries the bounds for new writes."""
    server = crds["InferenceServerConfig"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["modelServerConfig"]["properties"]
    assert (server["labels"]["maxProperties"], server["labels"]["additionalProperties"]["maxLength"]) == (64, 63)
    assert server["annotations"]["maxProperties"] == 64
    many = {f"key-{i}": "v" * 100 for i in range(100)}
    stored = {
        "apiVersion": API_VERSION,
        "kind": "InferenceServerConfig",
        "metadata": {"name": "old"},
        "spec": {"launcherConfigName": "lc", "modelServerConfig": {"port": 8005, "labels": many, "annotations": many}},
    }
    parsed = InferenceServerConfig.from_k8s(stored)
    assert parsed.spec.model_server_config.labels == many
