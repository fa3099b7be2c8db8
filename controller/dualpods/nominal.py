"""The nominal server-providing Pod of FMA's direct mode (fma.md §2.6): the model server a requester asks for, built
from the requester itself and its `server-patch` annotation, and the hash by which a sleeping copy of it is found.

The base is the requester made impersonal — its kind, labels and namespace, and its spec without what the API
server added for that one Pod (ephemeral containers, the node it was bound to, the ServiceAccount token volume) —
and the rendered patch is merged into it as a strategic merge patch. The hash covers the result, the GPU indices and
the node, so any requester of a set that lands on the same GPUs of the same node asks for the same server, and can
wake the one another requester left asleep.
"""

import base64
import copy
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Final

from api import keys
from controller import pods
from controller.go_template import PatchYAMLError, TemplateError, render_server_patch
from controller.strategic_merge import StrategicMergePatchError, apply_strategic_merge_patch, pod_schema

CUDA_VISIBLE_DEVICES: Final = "CUDA_VISIBLE_DEVICES"
# The token volume the API server's admission mounts into every Pod: `kube-api-access-*` (projected, Kubernetes
# 1.21+) or, before that, a Secret volume `<ServiceAccount>-token-*`.
_API_ACCESS: Final = re.compile(r"^kube-api-access-[a-z0-9]+$")


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
        pod = apply_strategic_merge_patch(_base(requester), patch, pod_schema())
    except (TemplateError, PatchYAMLError, StrategicMergePatchError) as err:
        raise NominalError(f"the server patch: {err}") from None
    digest = nominal_hash(pod, indices, node)
    if unknown := pod_schema().unknown_fields(pod):
        raise NominalError("strict decoding error: " + ", ".join(f'unknown field "{field}"' for field in unknown))
    spec = pod.setdefault("spec", {})
    spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), keys.HOSTNAME_LABEL: node}
    container = inference_server(pod)
    server_port(pod)  # a provider whose port is unknown could never be woken or put to sleep
    _set_env(container, CUDA_VISIBLE_DEVICES, ",".join(indices))
    resources = container.setdefault("resources", {})
    for kind in ("limits", "requests"):
        resources[kind] = {**(resources.get(kind) or {}), keys.GPU_RESOURCE: "0"}  # the requester holds the GPUs
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
    """FMA's formula, base64 (standard alphabet, unpadded) of sha256(Pod JSON;gpus=indices;node=node), over our
    canonical JSON (sorted keys) rather than Go's field order: the same inputs give the same hash here, not FMA's."""
    text = json.dumps(patched, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(f"{text};gpus={','.join(indices)};node={node}".encode()).digest()
    return base64.b64encode(digest).decode().rstrip("=")


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


def _base(requester: pods.Pod) -> pods.Pod:
    """The requester as FMA serializes its base Pod: TypeMeta, labels and namespace (empty ones omitted), and the
    de-individualized spec; no annotations, no status."""
    metadata: dict[str, Any] = {}
    if labels := pods.labels(requester):
        metadata["labels"] = dict(labels)
    if namespace := pods.meta(requester).get("namespace"):
        metadata["namespace"] = namespace
    return {
        "apiVersion": requester.get("apiVersion") or "v1",
        "kind": requester.get("kind") or "Pod",
        "metadata": metadata,
        "spec": deindividualized(requester.get("spec") or {}),
    }


def deindividualized(spec: dict[str, Any]) -> dict[str, Any]:
    """A copy of `spec` without what belongs to one Pod only: ephemeral containers (never given at creation), the
    node it is bound to, and the ServiceAccount token volume with its mounts (the API server adds its own)."""
    spec = copy.deepcopy(spec)
    spec.pop("ephemeralContainers", None)
    spec.pop("nodeName", None)
    account = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    token = re.compile(rf"^{re.escape(account)}-token-[a-z0-9]+$")
    goners = {
        volume["name"]
        for volume in spec.get("volumes") or []
        if _API_ACCESS.match(volume.get("name", "")) or (token.match(volume.get("name", "")) and "secret" in volume)
    }
    if not goners:
        return spec
    _set_or_drop(spec, "volumes", [v for v in spec["volumes"] if v["name"] not in goners])
    for kind in ("initContainers", "containers"):
        for container in spec.get(kind) or []:
            mounts = [m for m in container.get("volumeMounts") or [] if m.get("name") not in goners]
            _set_or_drop(container, "volumeMounts", mounts)
    return spec


def _set_or_drop(holder: dict[str, Any], key: str, items: list[Any]) -> None:
    """An emptied list is left out, as Go's `omitempty` leaves it out."""
    if items:
        holder[key] = items
    else:
        holder.pop(key, None)


def _set_env(container: dict[str, Any], name: str, value: str) -> None:
    env = container.setdefault("env", [])
    for var in env:
        if var.get("name") == name:
            var.pop("valueFrom", None)
            var["value"] = value
            return
    env.append({"name": name, "value": value})
