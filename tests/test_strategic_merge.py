"""The strategic merge patch engine against `kubectl patch --local --type strategic`, which runs apimachinery's own
`StrategicMergePatch`: the same Pod and patch must give the same Pod, or both must fail.

The oracle is `.venv/bin/kubectl` (`make tools`; `make test` installs it first). `--local` with an empty kubeconfig
reads the Pod from stdin and contacts no server.
"""

import copy
import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Final

import pytest

from gocompat.strategic_merge import (
    StrategicMergePatchError,
    apply_strategic_merge_patch,
    pod_schema,
)
from scripts.pod_patch_schema import OUT as POD_PATCH_SCHEMA_FILE
from scripts.pod_patch_schema import render as render_pod_patch_schema
from scripts.venv_tools import venv_tool

# A de-individualized server-requesting Pod, as the direct-mode controller patches it.
POD: Final[dict[str, Any]] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "namespace": "ns",
        "labels": {"app": "llm", "tier": "gpu"},
        "annotations": {"note": "kept"},
        "finalizers": ["f1", "f2"],
    },
    "spec": {
        "nodeSelector": {"zone": "a", "disk": "ssd"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}]
                }
            }
        },
        "initContainers": [{"name": "init", "image": "busybox", "command": ["sh", "-c", "true"]}],
        "containers": [
            {
                "name": "inference-server",
                "image": "requester:1",
                "command": ["requester"],
                "args": ["--port", "8080"],
                "env": [
                    {"name": "A", "value": "1"},
                    {"name": "B", "value": "2"},
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                ],
                "ports": [{"containerPort": 8080, "name": "http"}, {"containerPort": 8081, "name": "admin"}],
                "resources": {
                    "limits": {"cpu": "2", "nvidia.com/gpu": "1"},
                    "requests": {"cpu": "1", "nvidia.com/gpu": "1"},
                },
                "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}},
                "volumeMounts": [
                    {"name": "cache", "mountPath": "/cache"},
                    {"name": "models", "mountPath": "/models", "readOnly": True},
                ],
            },
            {"name": "sidecar", "image": "sidecar:1"},
        ],
        "volumes": [{"name": "cache", "emptyDir": {}}, {"name": "models", "hostPath": {"path": "/mnt/models"}}],
    },
}
SERVER = "inference-server"
# From stdin, never to a server, printed as JSON.
LOCAL_PATCH: Final = ["patch", "--local", "-f", "-", "--type", "strategic", "-o", "json"]


def kubectl_patch(pod: dict[str, Any], patch: str) -> dict[str, Any] | None:
    """kubectl's result of `patch` (JSON or YAML text) over `pod`, or None where kubectl refuses it."""
    done = subprocess.run(
        [str(venv_tool("kubectl")), "--kubeconfig", os.devnull, *LOCAL_PATCH, "-p", patch],
        input=json.dumps(pod),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        return None
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def ours(pod: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return apply_strategic_merge_patch(pod, patch, pod_schema())
    except StrategicMergePatchError:
        return None


def as_go_json(value: Any) -> str:
    """The value as Go prints it: a float64 with a whole value below 1e21 is written as an integer, with the
    shortest digits that read back as the same float."""

    def go(item: Any) -> Any:
        if isinstance(item, dict):
            return {key: go(sub) for key, sub in item.items()}
        if isinstance(item, list):
            return [go(sub) for sub in item]
        if isinstance(item, float) and item.is_integer() and abs(item) < 1e21:
            return int(Decimal(repr(item)))
        return item

    return json.dumps(go(value), sort_keys=True)


def assert_like_kubectl(patch: dict[str, Any], pod: dict[str, Any] = POD) -> None:
    expected = kubectl_patch(pod, json.dumps(patch))
    before = copy.deepcopy((pod, patch))
    got = ours(pod, patch)
    assert (pod, patch) == before, "the inputs were modified"
    if expected is None:
        assert got is None, f"kubectl refuses {patch}, we gave {got}"
    else:
        assert got is not None, f"we refuse {patch}, kubectl gives {expected}"
        assert as_go_json(got) == as_go_json(expected)


def spec(**fields: Any) -> dict[str, Any]:
    return {"spec": fields}


def server(**fields: Any) -> dict[str, Any]:
    """A patch of the inference-server container."""
    return spec(containers=[{"name": SERVER, **fields}])


CASES: Final[dict[str, dict[str, Any]]] = {
    # containers: merged by name
    "container add": spec(containers=[{"name": "vllm", "image": "vllm:1", "args": ["--model", "m"]}]),
    "container image by name": server(image="vllm:0.11"),
    "container delete": spec(containers=[{"name": "sidecar", "$patch": "delete"}]),
    "container delete absent": spec(containers=[{"name": "nope", "$patch": "delete"}]),
    "container delete then add": spec(
        containers=[{"name": "sidecar", "$patch": "delete"}, {"name": "sidecar", "image": "new"}]
    ),
    "container list replace": spec(containers=[{"$patch": "replace"}, {"name": "only", "image": "x"}]),
    "container new keeps nulls and directives": spec(
        containers=[
            {"name": "new", "image": "x", "env": [{"name": "A", "value": None}], "resources": {"$patch": "delete"}}
        ]
    ),
    "container patch order wins": spec(
        containers=[{"name": "sidecar", "image": "s:2"}, {"name": SERVER, "image": "v"}]
    ),
    "container twice in patch": spec(containers=[{"name": "c", "image": "1"}, {"name": "c", "args": ["x"]}]),
    "container without merge key": spec(containers=[{"image": "x"}]),
    "container merge directive": spec(containers=[{"name": SERVER, "$patch": "merge"}]),
    "container unknown directive": spec(containers=[{"name": SERVER, "$patch": "bogus"}]),
    "containers setElementOrder reorder": spec(
        **{"$setElementOrder/containers": [{"name": "sidecar"}, {"name": SERVER}]}
    ),
    "containers setElementOrder with new": spec(
        containers=[{"name": "new", "image": "n"}],
        **{"$setElementOrder/containers": [{"name": "sidecar"}, {"name": "new"}, {"name": SERVER}]},
    ),
    "containers setElementOrder mismatch": spec(
        containers=[{"name": "x", "image": "x"}, {"name": "y", "image": "y"}],
        **{"$setElementOrder/containers": [{"name": "y"}, {"name": "x"}]},
    ),
    "containers setElementOrder with delete and add": spec(
        containers=[{"name": SERVER, "$patch": "delete"}, {"name": "vllm", "image": "v"}],
        **{"$setElementOrder/containers": [{"name": "vllm"}, {"name": SERVER}]},
    ),
    "containers setElementOrder partial": spec(
        containers=[{"name": "sidecar", "image": "s:2"}], **{"$setElementOrder/containers": [{"name": "sidecar"}]}
    ),
    "containers null": spec(containers=None),
    # env: merged by name
    "env add": server(env=[{"name": "C", "value": "3"}]),
    "env modify": server(env=[{"name": "B", "value": "two"}]),
    "env delete": server(env=[{"name": "A", "$patch": "delete"}]),
    "env valueFrom merges with value": server(
        env=[{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    ),
    "env valueFrom replaces value": server(
        env=[{"name": "A", "value": None, "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    ),
    "env valueFrom to value": server(env=[{"name": "POD_IP", "valueFrom": None, "value": "127.0.0.1"}]),
    "env list replace": server(env=[{"$patch": "replace"}, {"name": "Z", "value": "z"}]),
    "env in new init container": spec(initContainers=[{"name": "warm", "image": "w", "env": [{"name": "X"}]}]),
    # volumes: merged by name, retainKeys only through the directive
    "volume add": spec(volumes=[{"name": "shm", "emptyDir": {"medium": "Memory"}}]),
    "volume type change keeps both": spec(volumes=[{"name": "models", "persistentVolumeClaim": {"claimName": "pvc"}}]),
    "volume type change retainKeys": spec(
        volumes=[
            {
                "name": "models",
                "$retainKeys": ["name", "persistentVolumeClaim"],
                "persistentVolumeClaim": {"claimName": "p"},
            }
        ]
    ),
    "volume retainKeys refuses other keys": spec(volumes=[{"name": "models", "$retainKeys": ["name"], "emptyDir": {}}]),
    "volume retainKeys not a list": spec(volumes=[{"name": "models", "$retainKeys": "name"}]),
    "volume new keeps retainKeys": spec(volumes=[{"name": "n", "$retainKeys": ["name", "emptyDir"], "emptyDir": {}}]),
    "volume delete": spec(volumes=[{"name": "cache", "$patch": "delete"}]),
    "volume source null": spec(volumes=[{"name": "models", "hostPath": None, "emptyDir": {}}]),
    # volumeMounts: merged by mountPath
    "volumeMount add": server(volumeMounts=[{"name": "shm", "mountPath": "/dev/shm"}]),
    "volumeMount modify": server(volumeMounts=[{"mountPath": "/models", "readOnly": False, "subPath": "m"}]),
    "volumeMount delete": server(volumeMounts=[{"mountPath": "/cache", "$patch": "delete"}]),
    "volumeMount same name new path": server(volumeMounts=[{"name": "cache", "mountPath": "/other"}]),
    # ports: merged by containerPort (an integer: 8080.0 is another key to Go)
    "port add": server(ports=[{"containerPort": 9000, "name": "metrics"}]),
    "port modify": server(ports=[{"containerPort": 8080, "name": "web", "protocol": "TCP"}]),
    "port delete": server(ports=[{"containerPort": 8081, "$patch": "delete"}]),
    "port float key is another port": server(ports=[{"containerPort": 8080.0, "name": "float"}]),
    "port string key is another port": server(ports=[{"containerPort": "8080", "name": "string"}]),
    # resources: maps
    "gpu limit and request to zero": server(
        resources={"limits": {"nvidia.com/gpu": "0"}, "requests": {"nvidia.com/gpu": 0}}
    ),
    "gpu removed": server(resources={"limits": {"nvidia.com/gpu": None}, "requests": {"nvidia.com/gpu": None}}),
    "limits delete directive": server(resources={"limits": {"$patch": "delete"}}),
    "resources replace": server(resources={"$patch": "replace", "limits": {"memory": "1Gi"}}),
    "resources replace keeps nulls": server(resources={"$patch": "replace", "limits": None}),
    "resources null": server(resources=None),
    "resources merge directive": server(resources={"$patch": "merge"}),
    # tolerations: atomic
    "tolerations replaced": spec(tolerations=[{"key": "k", "operator": "Equal", "value": "v"}]),
    "tolerations delete directive is data": spec(tolerations=[{"key": "k", "$patch": "delete"}]),
    "tolerations emptied": spec(tolerations=[]),
    # nodeSelector, labels, annotations: maps of strings
    "nodeSelector hostname": spec(nodeSelector={"kubernetes.io/hostname": "node-1"}),
    "nodeSelector null deletes": spec(nodeSelector={"zone": None, "disk": None}),
    "nodeSelector replace": spec(nodeSelector={"$patch": "replace", "kubernetes.io/hostname": "n"}),
    "nodeSelector delete": spec(nodeSelector={"$patch": "delete"}),
    "nodeSelector null whole": spec(nodeSelector=None),
    "labels off the selector": {"metadata": {"labels": {"app": None, "dual-pods.llm-d.ai/dual": "x"}}},
    "labels all deleted": {"metadata": {"labels": {"app": None, "tier": None}}},
    "annotations null absent key": {"metadata": {"annotations": {"absent": None, "new": "v"}}},
    "annotations new map drops nulls": {"metadata": {"annotations": None}, "spec": {"hostname": "h"}},
    "new map drops nulls": spec(overhead={"cpu": None, "memory": "1Mi"}),
    "new map drops directives": spec(securityContext={"runAsUser": 1, "seLinuxOptions": {"$patch": "delete"}}),
    "new map with directive is dropped": spec(dnsConfig={"$patch": "replace", "nameservers": ["1.1.1.1"]}),
    "directive on scalar field": spec(hostname={"$patch": "delete"}),
    # finalizers: a merged list of scalars
    "finalizer add": {"metadata": {"finalizers": ["dual-pods.llm-d.ai/provider"]}},
    "finalizer add dedups": {"metadata": {"finalizers": ["f2", "f3", "f3"]}},
    "finalizer deleteFromPrimitiveList": {"metadata": {"$deleteFromPrimitiveList/finalizers": ["f1", "nope"]}},
    "finalizer deleteFromPrimitiveList absent list": spec(**{"$deleteFromPrimitiveList/schedulingGates": ["x"]}),
    "finalizer deleteFromPrimitiveList null": {"metadata": {"$deleteFromPrimitiveList/finalizers": None}},
    "finalizer setElementOrder": {
        "metadata": {"finalizers": ["f3"], "$setElementOrder/finalizers": ["f3", "f2", "f1"]}
    },
    "finalizer setElementOrder only": {"metadata": {"$setElementOrder/finalizers": ["f2", "f1"]}},
    "finalizer empty setElementOrder": {"metadata": {"finalizers": ["f3", "f4"], "$setElementOrder/finalizers": []}},
    "finalizer mixed types": {"metadata": {"finalizers": [1]}},
    "finalizer lists of lists": {"metadata": {"finalizers": [["x"]]}},
    "deleteFromPrimitiveList bad key": {"metadata": {"$deleteFromPrimitiveList": ["f1"]}},
    "setElementOrder bad key": {"metadata": {"$setElementOrderfinalizers": ["f1"]}},
    "setElementOrder not a list": {"metadata": {"$setElementOrder/finalizers": "f1"}},
    "deleteFromPrimitiveList on a merged list of objects": spec(
        **{"$deleteFromPrimitiveList/containers": [{"name": "sidecar"}]}
    ),
    "deleteFromPrimitiveList on an atomic list": server(**{"$deleteFromPrimitiveList/args": ["--port"]}),
    # args, command: atomic
    "args replaced": server(args=["--model", "m", "--port", "8000"]),
    "command replaced": server(command=["vllm", "serve"]),
    "args null": server(args=None),
    # initContainers
    "initContainer add": spec(initContainers=[{"name": "fetch", "image": "f"}]),
    "initContainer modify": spec(initContainers=[{"name": "init", "command": ["sh", "-c", "sleep 1"]}]),
    "initContainer delete": spec(initContainers=[{"name": "init", "$patch": "delete"}]),
    # affinity: nested maps with an atomic list inside
    "affinity nested merge": spec(
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}
                    ]
                }
            },
            "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
        }
    ),
    "affinity replace": spec(affinity={"$patch": "replace", "podAffinity": {}}),
    "affinity delete": spec(affinity={"$patch": "delete"}),
    "affinity null": spec(affinity=None),
    # whole-object and type changes
    "metadata replace": {"metadata": {"$patch": "replace", "name": "x"}},
    "spec delete": {"spec": {"$patch": "delete"}},
    "map over list": spec(volumes={"a": "b"}),
    "list over map": spec(nodeSelector=["a"]),
    "scalar over map": spec(affinity="none"),
    "empty patch": {},
}


@pytest.mark.parametrize("patch", CASES.values(), ids=CASES.keys())
def test_matches_kubectl(patch: dict[str, Any]) -> None:
    assert_like_kubectl(patch)


def test_pod_without_lists_gains_them_as_kubectl_does() -> None:
    bare = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}
    assert_like_kubectl(
        {
            "metadata": {"finalizers": ["a"], "$deleteFromPrimitiveList/finalizers": ["b"], "labels": {"x": None}},
            "spec": {
                "volumes": [{"name": "v", "$patch": "delete"}, {"name": "w", "emptyDir": {"sizeLimit": None}}],
                "$setElementOrder/initContainers": [{"name": "b"}, {"name": "a"}],
                "initContainers": [{"name": "a", "image": None}, {"name": "b"}, {"name": "z", "$patch": "delete"}],
            },
        },
        bare,
    )


def test_unknown_field_merges_where_apimachinery_fails() -> None:
    """Go's types have no such field, so apimachinery refuses to merge it; we merge it as a map (and replace it as a
    list), and the strict decoding of the resulting Pod reports it."""
    pod = copy.deepcopy(POD)
    pod["spec"]["containers"][1]["extra"] = {"a": 1, "b": [1]}
    patch = spec(containers=[{"name": "sidecar", "extra": {"a": None, "b": [2], "c": 3}}])
    assert kubectl_patch(pod, json.dumps(patch)) is None
    got = apply_strategic_merge_patch(pod, patch, pod_schema())
    assert got["spec"]["containers"][1]["extra"] == {"b": [2], "c": 3}


# A seeded generator of patches over POD, each one checked against kubectl. It draws from the fields the direct
# mode patches and from the directives, including ill-formed patches (both must then refuse them). It avoids what
# Go itself leaves to map iteration order: a value both added to and deleted from one list by the same patch.
RANDOM_PATCHES: Final = 60
RANDOM_LIST_CASES: Final = 60
NAMES: Final = [f"n{i}" for i in range(10)]
Gen = Callable[[random.Random], Any]


def maybe(rng: random.Random, chance: float = 0.5) -> bool:
    return rng.random() < chance


def scalar(rng: random.Random) -> Any:
    return rng.choice(["x", "y", "", None, 1, 8080, 8080.0, True])


def string_map(rng: random.Random, keys: list[str]) -> dict[str, Any]:
    result: dict[str, Any] = {
        key: rng.choice(["v1", "v2", None]) for key in rng.sample(keys, rng.randint(0, len(keys)))
    }
    if maybe(rng, 0.1):
        result["$patch"] = rng.choice(["replace", "delete", "merge"])
    return result


def merged_list(rng: random.Random, key: str, values: list[Any], element: Gen) -> list[dict[str, Any]]:
    """Elements of a list merged by `key`, some with directives."""
    result = []
    for value in rng.sample(values, rng.randint(0, len(values))):
        item = {key: value, **element(rng)}
        roll = rng.random()
        if roll < 0.15:
            item = {key: value, "$patch": "delete"}
        elif roll < 0.18:
            item = {"$patch": "replace"}
        result.append(item)
    if maybe(rng, 0.05):
        result.append({"no-merge-key": 1})
    return result


def with_order(
    rng: random.Random, patch: dict[str, Any], field: str, values: list[Any], key: str = "", chance: float = 0.3
) -> None:
    """Sometimes a `$setElementOrder` for the field (a list of objects merged by `key`, or of scalars): consistent
    with the patch, or shuffled (then maybe refused)."""
    if not maybe(rng, chance):
        return
    items = patch.get(field, [])
    named = [item[key] for item in items if key in item and "$patch" not in item] if key else list(items)
    order = list(dict.fromkeys(named + rng.sample(values, rng.randint(1, len(values)))))
    if maybe(rng, 0.8):
        order.sort(key=lambda value: named.index(value) if value in named else rng.random() * len(named))
    else:
        rng.shuffle(order)
    patch[f"$setElementOrder/{field}"] = [{key: value} for value in order] if key else order


def finalizers(rng: random.Random, metadata: dict[str, Any], values: list[str]) -> None:
    """Finalizers added, deleted (never one both added and deleted) and ordered."""
    added = rng.sample(values, rng.randint(0, 3))
    metadata["finalizers"] = added
    if maybe(rng):
        metadata["$deleteFromPrimitiveList/finalizers"] = [v for v in rng.sample(values, 2) if v not in added]
    with_order(rng, metadata, "finalizers", values, chance=0.4)


def env_var(rng: random.Random) -> dict[str, Any]:
    return rng.choice(
        [{"value": rng.choice(["a", None])}, {"valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}, {}]
    )


def container(rng: random.Random) -> dict[str, Any]:
    patch: dict[str, Any] = {}
    if maybe(rng):
        patch["image"] = rng.choice(["vllm:1", None])
    if maybe(rng, 0.3):
        patch["args"] = rng.choice([["--a"], [], None])
    if maybe(rng):
        patch["env"] = merged_list(rng, "name", ["A", "B", "POD_IP", "NEW"], env_var)
        with_order(rng, patch, "env", ["A", "B", "POD_IP", "NEW"], "name")
    if maybe(rng, 0.3):
        patch["ports"] = merged_list(
            rng, "containerPort", [8080, 8081, 9000], lambda r: {"name": r.choice(["p", None])}
        )
    if maybe(rng, 0.4):
        patch["resources"] = {
            part: string_map(rng, ["cpu", "nvidia.com/gpu", "memory"]) for part in rng.sample(["limits", "requests"], 1)
        }
    if maybe(rng, 0.3):
        patch["volumeMounts"] = merged_list(rng, "mountPath", ["/cache", "/models", "/new"], lambda r: {"name": "m"})
    return patch


def volume(rng: random.Random) -> dict[str, Any]:
    source = rng.choice(["emptyDir", "hostPath", "configMap"])
    value = {"emptyDir": {}, "hostPath": {"path": "/p"}, "configMap": {"name": "c"}}[source]
    patch: dict[str, Any] = {source: value}
    if maybe(rng, 0.4):
        patch["$retainKeys"] = ["name", source] if maybe(rng, 0.8) else ["name"]
    return patch


def random_patch(rng: random.Random) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    if maybe(rng):
        metadata["labels"] = string_map(rng, ["app", "tier", "new"])
    if maybe(rng, 0.3):
        metadata["annotations"] = string_map(rng, ["note", "other"])
    if maybe(rng, 0.4):
        finalizers(rng, metadata, ["f1", "f2", "f3", "f4"])
    body: dict[str, Any] = {}
    if maybe(rng, 0.7):
        body["containers"] = merged_list(rng, "name", [SERVER, "sidecar", "vllm"], container)
        with_order(rng, body, "containers", [SERVER, "sidecar", "vllm"], "name")
    if maybe(rng, 0.2):
        body["initContainers"] = merged_list(rng, "name", ["init", "warm"], container)
    if maybe(rng, 0.4):
        body["volumes"] = merged_list(rng, "name", ["cache", "models", "shm"], volume)
    if maybe(rng, 0.4):
        body["nodeSelector"] = string_map(rng, ["zone", "disk", "kubernetes.io/hostname"])
    if maybe(rng, 0.2):
        body["tolerations"] = rng.choice([[], [{"key": "k", "operator": "Exists"}], None])
    if maybe(rng, 0.2):
        body["affinity"] = rng.choice([None, {"nodeAffinity": None}, {"podAffinity": {"x": scalar(rng)}}])
    if maybe(rng, 0.1):
        body["hostname"] = scalar(rng)
    patch: dict[str, Any] = {}
    if metadata:
        patch["metadata"] = metadata
    if body:
        patch["spec"] = body
    return patch


@pytest.mark.parametrize("seed", range(RANDOM_PATCHES))
def test_random_patch_matches_kubectl(seed: int) -> None:
    assert_like_kubectl(random_patch(random.Random(seed)))


def random_list_case(rng: random.Random) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Pod with lists of 0 to 9 elements and a patch that deletes, adds, replaces and reorders their elements:
    where Go's in-place deletions show through (see `_merge_list`)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"finalizers": rng.sample(NAMES, rng.randint(0, 5))},
        "spec": {"containers": [{"name": name, "image": "old"} for name in rng.sample(NAMES, rng.randint(0, 9))]},
    }
    body = {"containers": merged_list(rng, "name", NAMES[: rng.randint(1, 10)], lambda r: {"image": "new"})}
    with_order(rng, body, "containers", NAMES, "name", chance=0.8)
    metadata: dict[str, Any] = {}
    finalizers(rng, metadata, NAMES[:6])
    return pod, {"metadata": metadata, "spec": body}


@pytest.mark.parametrize("seed", range(RANDOM_LIST_CASES))
def test_random_list_patch_matches_kubectl(seed: int) -> None:
    pod, patch = random_list_case(random.Random(seed))
    assert_like_kubectl(patch, pod)


# ----- the committed Pod schema


def test_the_pod_patch_schema_is_current() -> None:
    assert POD_PATCH_SCHEMA_FILE.read_text() == render_pod_patch_schema(), (
        "gocompat/pod_patch_schema.json is out of date: run `python -m scripts.pod_patch_schema`"
    )


def test_the_controller_needs_no_development_package_for_the_schema() -> None:
    """The controller image installs only the runtime dependencies: merging must not reach kubernetes-validate."""
    check = (
        "import sys; sys.modules['kubernetes_validate'] = None; "  # as if not installed: importing it fails
        "import controller.dualpods.controller, gocompat.strategic_merge as m; m.pod_schema(); "
        "assert 'api.crdgen' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", check], check=True, timeout=60)


def test_unknown_fields_are_named_as_strict_decoding_names_them() -> None:
    pod = copy.deepcopy(POD)
    pod["spec"]["contianers"] = []
    pod["spec"]["containers"][0]["imag"] = "x"
    pod["spec"]["containers"][0]["resources"]["limits"]["example.com/any"] = "1"  # a map: any key
    assert pod_schema().unknown_fields(pod) == ["spec.containers[0].imag", "spec.contianers"]
    assert pod_schema().unknown_fields(POD) == []
