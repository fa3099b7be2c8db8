"""The nominal server-providing Pod of FMA's direct mode (fma.md §2.6): the model server a requester asks for, built
from the requester itself and its `server-patch` annotation, and the hash by which a sleeping copy of it is found.

The base is the requester made impersonal exactly as FMA makes it — its labels and namespace, and its spec
de-individualized (no ephemeral containers, and without the first `kube-api-access-*` volume and its mounts; the
node it is bound to stays, so the provider goes straight to that node) — read as Go reads a `corev1.Pod` (unknown
fields dropped, an empty status, no TypeMeta: FMA's informer clears it), and the rendered patch is merged into it as
a strategic merge patch. The hash covers the result, the GPU indices and the node, so any requester of a set that
lands on the same GPUs of the same node asks for the same server, and can wake the one another requester left
asleep. It is FMA's, byte for byte: base64 (standard alphabet, unpadded) of SHA-256 over Go's `json.Marshal` of
the merged Pod as a generic map (keys sorted, numbers as float64, HTML characters escaped; see `gocompat.gojson`),
then `;gpus=<indices joined by commas>;node=<node>`.
"""

from dataclasses import dataclass
from typing import Any, Final

from api import keys
from controller import pods
from controller.pod_hashing import deindividualize, go_hash
from gocompat import gojson
from gocompat.go_template import GoTemplateError, PatchYAMLError, render_server_patch
from gocompat.strategic_merge import StrategicMergePatchError, apply_strategic_merge_patch, pod_schema

CUDA_VISIBLE_DEVICES: Final = "CUDA_VISIBLE_DEVICES"


class NominalError(ValueError):
    """The requester's server patch does not make a Pod the controller can run (the message says why)."""


@dataclass(frozen=True)
class Nominal:
    pod: pods.Pod  # ready to create, but for the binding (see writer.set_binding)
    hash: str


def nominal_provider(requester: pods.Pod, node: str, indices: list[str], gpus: list[str]) -> Nominal:
    """The provider `requester` asks for on `node`, confined to the GPUs at `indices` (whose UUIDs are `gpus`)."""
    source = pods.annotations(requester).get(keys.SERVER_PATCH_ANNOTATION, "")
    try:
        patch = render_server_patch(source, {"NodeName": node, "LocalVolume": ""})
        pod = apply_strategic_merge_patch(base_pod(requester), patch, pod_schema())
    except (GoTemplateError, PatchYAMLError, StrategicMergePatchError) as err:
        raise NominalError(f"the server patch: {err}") from None
    except gojson.GoTypeError as err:
        raise NominalError(f"the requester is not a Pod as Go reads one: {err}") from None
    digest = nominal_hash(pod, indices, node)
    if unknown := pod_schema().unknown_fields(pod):
        raise NominalError("strict decoding error: " + ", ".join(f'unknown field "{field}"' for field in unknown))
    pod = {"apiVersion": "v1", "kind": "Pod", **{k: v for k, v in pod.items() if k != "status"}}
    spec = pod.setdefault("spec", {})
    spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), keys.HOSTNAME_LABEL: node}
    container = inference_server(pod)
    server_port(pod)  # a provider whose port is unknown could never be woken or put to sleep
    _set_env(container, CUDA_VISIBLE_DEVICES, ",".join(indices))
    resources = container.setdefault("resources", {})
    for kind in ("limits", "requests"):
        resources[kind] = {**(resources.get(kind) or {}), keys.GPU_RESOURCE: "0"}  # the requester holds the GPUs
    # A DRA requester holds them through its ResourceClaims: the provider claims nothing of its own.
    spec.pop("resourceClaims", None)
    for each in spec.get("containers") or []:
        (each.get("resources") or {}).pop("claims", None)
    metadata = pod.setdefault("metadata", {})
    metadata["generateName"] = f"{pods.name(requester)}-dual-"
    metadata["annotations"] = {
        **(metadata.get("annotations") or {}),
        keys.NOMINAL_ANNOTATION: digest,
        keys.ACCELERATORS_ANNOTATION: ",".join(gpus),
    }
    metadata["labels"] = {**(metadata.get("labels") or {}), keys.SLEEPING_LABEL: "false"}
    return Nominal(pod, digest)


def nominal_hash(patched: pods.Pod, indices: list[str], node: str) -> str:
    """FMA's hash of the merged nominal Pod on the GPUs at `indices` of `node`."""
    return go_hash(f"{gojson.marshal(patched)};gpus={','.join(indices)};node={node}")


def inference_server(pod: pods.Pod) -> dict[str, Any]:
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == keys.INFERENCE_SERVER_CONTAINER:
            found: dict[str, Any] = container
            return found
    raise NominalError(f'container "{keys.INFERENCE_SERVER_CONTAINER}" not found')


def server_port(pod: pods.Pod) -> int:
    """The model server's port: the one its readinessProbe asks (FMA's rule, plus the container's named ports)."""
    container = inference_server(pod)
    probe = container.get("readinessProbe")
    if not probe:
        raise NominalError("the inference server container has no readinessProbe")
    if not probe.get("httpGet"):
        raise NominalError("the readinessProbe is not an HTTPGet")
    port = probe["httpGet"].get("port")
    if isinstance(port, int) and not isinstance(port, bool):
        return port
    for named in container.get("ports") or []:
        if port and named.get("name") == port:
            return int(named["containerPort"])
    if port in ("http", "HTTP"):
        return 80
    raise NominalError(f"unsupported readinessProbe port {port!r}")


def gpu_keys(pod: pods.Pod) -> list[str]:
    """The keys `<node> <index>` of each GPU a direct provider may use (its CUDA_VISIBLE_DEVICES): the sleeper index."""
    node = pods.node_name(pod)
    if keys.NOMINAL_ANNOTATION not in pods.annotations(pod) or not node:
        return []
    try:
        env = inference_server(pod).get("env") or []
    except NominalError:
        return []
    value = next((e.get("value") or "" for e in env if e.get("name") == CUDA_VISIBLE_DEVICES), "")
    return [f"{node} {index.strip()}" for index in value.split(",") if index.strip()]


def base_pod(requester: pods.Pod) -> pods.Pod:
    """The requester as FMA's base Pod: labels and namespace (empty ones left out), the de-individualized spec,
    read into Go's Pod type; no TypeMeta, no annotations, an empty status."""
    metadata = {"labels": pods.labels(requester), "namespace": pods.meta(requester).get("namespace")}
    base: pods.Pod = gojson.typed(
        {"metadata": metadata, "spec": deindividualize(requester.get("spec") or {})}, "core.Pod"
    )
    return base


def _set_env(container: dict[str, Any], name: str, value: str) -> None:
    env = container.setdefault("env", [])
    for var in env:
        if var.get("name") == name:
            var.pop("valueFrom", None)
            var["value"] = value
            return
    env.append({"name": name, "value": value})
