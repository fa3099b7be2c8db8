"""Launcher Pods made from a LauncherConfig: one definition shared by both controllers.

The populator and the dual-pods controller must agree exactly on what a launcher made from a given
LauncherConfig looks like, so both build it here. The template hash identifies the node-independent
Pod: a launcher whose hash differs from its LauncherConfig's current one is stale. The config hash adds
the node and is how the dual-pods controller finds the launchers it may bind on a node.

Both hashes are FMA's, byte for byte, so that launchers FMA made are current here and ours are current
for FMA (a migration keeps its launchers and their sleeping instances). The template hash is base64
(standard alphabet, unpadded) of the SHA-256 of Go's `json.Marshal` of the Pod FMA builds *before* it
patches the launcher container: no TypeMeta; metadata with generateName `launcher-<name>-`, the namespace,
the template's labels plus the component, launcher-config-name and sleeping=true labels, the template's
annotations and the LauncherConfig owner reference; the template's spec de-individualized (the first
`kube-api-access-*` volume and its mounts and all ephemeral containers dropped) and with its
order-free lists stably sorted as FMA sorts them; an empty status. The config hash is the same encoding
of SHA-256 over `<template hash>;node=<node>`. What each controller adds afterwards (probes, forced
environment, our token volume) is in neither hash, as in FMA.
"""

import copy
from collections.abc import Callable
from typing import Any, Final

from api import keys
from api.crds import API_VERSION, LauncherConfig
from controller.pod_hashing import deindividualize, go_hash
from gocompat import gojson

Pod = dict[str, Any]

# FMA's sort keys for the lists whose order means nothing (stable sorts, values as Go decodes them).
_SORTED_POD_LISTS: Final[dict[str, Callable[[dict[str, Any]], tuple[Any, ...]]]] = {
    "volumes": lambda v: (v.get("name") or "",),
    "tolerations": lambda t: tuple(t.get(f) or "" for f in ("key", "operator", "value", "effect")),
    "imagePullSecrets": lambda s: (s.get("name") or "",),
}
_SORTED_CONTAINER_LISTS: Final[dict[str, Callable[[dict[str, Any]], tuple[Any, ...]]]] = {
    "volumeMounts": lambda m: (m.get("name") or "", m.get("mountPath") or ""),
    "ports": lambda p: (p.get("name") or "", p.get("containerPort") or 0, p.get("protocol") or ""),
    "envFrom": lambda e: (e.get("prefix") or "",),
}
FORCED_ENV = {
    # The launcher sees every GPU of the node and confines each instance with CUDA_VISIBLE_DEVICES.
    "NVIDIA_VISIBLE_DEVICES": "all",
    "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
    # vLLM's /sleep, /wake_up and /is_sleeping routes.
    "VLLM_SERVER_DEV_MODE": "1",
}
# What the launcher's --mock-gpus mode reads to find its node's entry in the gpu-map ConfigMap.
DOWNWARD_ENV = {"NODE_NAME": "spec.nodeName", "NAMESPACE": "metadata.namespace"}
TOKEN_VOLUME = "dualpods-launcher-token"
TOKEN_DIR = "/var/run/secrets/dualpods/launcher-token"
# How long a launcher may take to answer first (its image pulled, vLLM imported: tens of seconds on a GPU node, a
# few minutes on a loaded CPU machine): what its startup probe allows, and the dual-pods controller's default
# --launcher-start-budget.
LAUNCHER_START_S = 300
STARTUP_PROBE_PERIOD_S = 2


class TemplateError(ValueError):
    """A LauncherConfig whose podTemplate cannot make a launcher Pod."""


def _canonical_spec(spec: dict[str, Any]) -> dict[str, Any]:
    spec = deindividualize(spec)
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        for name, key in _SORTED_CONTAINER_LISTS.items():
            if isinstance(container.get(name), list):
                container[name] = sorted(container[name], key=key)
    for name, key in _SORTED_POD_LISTS.items():
        if isinstance(spec.get(name), list):
            spec[name] = sorted(spec[name], key=key)
    return spec


def _set_env(container: dict[str, Any], name: str, entry: dict[str, Any]) -> None:
    env = [e for e in container.get("env", []) if e.get("name") != name]
    container["env"] = [*env, {"name": name, **entry}]


def _patch_launcher_container(container: dict[str, Any], token_secret: str | None) -> None:
    for name, value in FORCED_ENV.items():
        _set_env(container, name, {"value": value})
    for name, path in DOWNWARD_ENV.items():
        if not any(e.get("name") == name for e in container.get("env", [])):
            _set_env(container, name, {"valueFrom": {"fieldRef": {"fieldPath": path}}})
    health = {"httpGet": {"path": "/health", "port": keys.LAUNCHER_PORT}}
    # Liveness and readiness wait for the launcher's first answer, for up to LAUNCHER_START_S: preloading vLLM
    # took 47 s on a busy 2-core node, and FMA's liveness probe alone (10 + 2 x 20 s) then restarted the
    # launcher just before it served, again at each start.
    container["startupProbe"] = {
        **health, "periodSeconds": STARTUP_PROBE_PERIOD_S, "timeoutSeconds": 2,
        "failureThreshold": LAUNCHER_START_S // STARTUP_PROBE_PERIOD_S,
    }  # fmt: skip
    container["livenessProbe"] = {
        **health, "initialDelaySeconds": 10, "periodSeconds": 20, "timeoutSeconds": 1, "failureThreshold": 3,
    }  # fmt: skip
    # /health answers once vLLM is preloaded, and needs no token (E9).
    container["readinessProbe"] = {
        **health, "initialDelaySeconds": 2, "periodSeconds": 5, "timeoutSeconds": 2, "failureThreshold": 3,
    }  # fmt: skip
    resources = container.setdefault("resources", {})
    for kind in ("limits", "requests"):
        if keys.GPU_RESOURCE in resources.get(kind, {}):
            resources[kind][keys.GPU_RESOURCE] = "0"
    if token_secret:
        _set_env(container, "LAUNCHER_AUTH_TOKEN_FILE", {"value": f"{TOKEN_DIR}/token"})
        mounts = [m for m in container.get("volumeMounts", []) if m.get("name") != TOKEN_VOLUME]
        container["volumeMounts"] = [*mounts, {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True}]


def template_hash(metadata: dict[str, Any], spec: dict[str, Any]) -> str:
    """FMA's template hash of the unpatched launcher Pod with this metadata and (canonical) spec."""
    return go_hash(gojson.marshal(gojson.typed({"metadata": metadata, "spec": spec}, "core.Pod"), sort_keys=False))


def node_independent_pod(
    config: LauncherConfig, token_secret: str | None = None, runtime_class: str | None = None
) -> tuple[Pod, str]:
    """The launcher Pod for `config` on any node, and its template hash. `runtime_class`: the cluster's
    RuntimeClass through which launchers see every GPU (`nvidia`, `nvidia-legacy` under the GPU Operator's
    CDI), for templates that name none; like the token, outside the hash, so it never makes launchers stale."""
    name = config.metadata.name
    canonical = _canonical_spec(config.spec.pod_template.spec)
    template = config.spec.pod_template.metadata
    metadata: dict[str, Any] = {
        "generateName": f"launcher-{name}-",
        "namespace": config.metadata.namespace,
        "labels": {
            **template.labels,
            keys.COMPONENT_LABEL: keys.LAUNCHER_COMPONENT,
            keys.LAUNCHER_CONFIG_NAME_LABEL: name,
            keys.SLEEPING_LABEL: "true",
        },
        "annotations": dict(template.annotations),
        "ownerReferences": [
            {
                "apiVersion": API_VERSION,
                "kind": config.RESOURCE.kind,
                "name": name,
                "uid": config.metadata.uid,
                "controller": False,
                "blockOwnerDeletion": False,
            }
        ],
    }
    try:
        digest = template_hash(metadata, canonical)
    except gojson.GoTypeError as err:
        raise TemplateError(f"LauncherConfig {name}: podTemplate is not a Pod template: {err}") from None
    spec = copy.deepcopy(canonical)
    containers = spec.get("containers") or []
    launcher = next((c for c in containers if c.get("name") == keys.INFERENCE_SERVER_CONTAINER), None)
    if launcher is None:
        raise TemplateError(
            f"LauncherConfig {name}: podTemplate.spec has no container named {keys.INFERENCE_SERVER_CONTAINER!r}"
        )
    _patch_launcher_container(launcher, token_secret)
    if isinstance(spec.get("overhead"), dict):
        spec["overhead"].pop(keys.GPU_RESOURCE, None)
    if runtime_class and not spec.get("runtimeClassName"):
        spec["runtimeClassName"] = runtime_class
    if token_secret:
        volumes = [v for v in spec.get("volumes", []) if v.get("name") != TOKEN_VOLUME]
        spec["volumes"] = [*volumes, {"name": TOKEN_VOLUME, "secret": {"secretName": token_secret}}]
    metadata["annotations"][keys.LAUNCHER_TEMPLATE_HASH_ANNOTATION] = digest
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}, digest


def launcher_config_hash(template_hash: str, node: str) -> str:
    return go_hash(f"{template_hash};node={node}")


def pod_for_node(node_independent: Pod, template_hash: str, node: str) -> Pod:
    """A copy of the node-independent launcher Pod pinned to `node`."""
    pod = copy.deepcopy(node_independent)
    pod["metadata"]["labels"][keys.NODE_NAME_LABEL] = node
    pod["metadata"]["annotations"][keys.LAUNCHER_CONFIG_HASH_ANNOTATION] = launcher_config_hash(template_hash, node)
    pod["spec"].setdefault("nodeSelector", {})[keys.HOSTNAME_LABEL] = node
    return pod
