"""A container's environment, resolved as the kubelet does: envFrom, env with `valueFrom`, `$(VAR)` expansion.

One fake, for what cannot be real here: a Pod's own loopback. Every Pod of the loopback cluster shares the host's
network with an address of its own, so a URL in a container's env that names `127.0.0.1` or `localhost` (a sidecar
calling its Pod's main container, as FMA's launcher notifier does with `http://127.0.0.1:8001`) is given the Pod's
address instead, where the Pod's own network namespace would have routed it.
"""

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from kubernetes_asyncio import client

# (kind "configmap"|"secret", namespace, name) -> the object's data, decoded, or None when absent.
Fetch = Callable[[str, str, str], Awaitable[dict[str, str] | None]]

_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")
_LOOPBACK_URL_HOST = re.compile(r"(?<=://)(?:127\.0\.0\.1|localhost)(?=[:/]|$)")


class ContainerConfigError(ValueError):
    """The container cannot be configured yet (a missing ConfigMap key, an unsupported reference)."""


def expand(text: str, variables: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: `$$` is a literal `$`, unknown references stay as written."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] != "$" or i + 1 == len(text):
            out.append(text[i])
            i += 1
            continue
        following = text[i + 1]
        if following == "$":
            out.append("$")
            i += 2
        elif following == "(" and (close := text.find(")", i + 2)) != -1:
            name = text[i + 2 : close]
            out.append(variables.get(name, f"$({name})"))
            i = close + 1
        else:
            out.append("$" + following)
            i += 2
    return "".join(out)


@dataclass(frozen=True)
class PodFields:
    """What the downward API can read; addresses come from the kubelet, not the (maybe stale) status."""

    pod: client.V1Pod
    pod_ip: str
    host_ip: str

    def field(self, path: str) -> str:
        meta, spec = self.pod.metadata, self.pod.spec
        simple = {
            "metadata.name": meta.name,
            "metadata.namespace": meta.namespace,
            "metadata.uid": meta.uid,
            "spec.nodeName": spec.node_name,
            "spec.serviceAccountName": spec.service_account_name or "default",
            "status.podIP": self.pod_ip,
            "status.podIPs": self.pod_ip,
            "status.hostIP": self.host_ip,
        }
        if path in simple:
            return simple[path] or ""
        match = _SUBSCRIPT.match(path)
        if match:
            source = meta.labels if match.group(1) == "labels" else meta.annotations
            return str((source or {}).get(match.group(2), ""))
        raise ContainerConfigError(f"fieldRef {path!r} is not supported")


async def _key(fetch: Fetch, kind: str, namespace: str, ref: client.V1ConfigMapKeySelector) -> str | None:
    data = await fetch(kind, namespace, ref.name)
    if data is None or ref.key not in data:
        if ref.optional:
            return None
        what = f"{kind} {namespace}/{ref.name}"
        raise ContainerConfigError(f"{what} not found" if data is None else f"key {ref.key!r} not found in {what}")
    return data[ref.key]


async def resolve_env(
    container: client.V1Container, fields: PodFields, service_env: Mapping[str, str], fetch: Fetch
) -> dict[str, str]:
    """The variables the Pod spec gives `container` (service variables first, then envFrom, then env)."""
    namespace = fields.pod.metadata.namespace
    env = dict(service_env)
    for source in container.env_from or []:
        ref = source.config_map_ref or source.secret_ref
        kind = "configmap" if source.config_map_ref else "secret"
        data = await fetch(kind, namespace, ref.name)
        if data is None:
            if ref.optional:
                continue
            raise ContainerConfigError(f"{kind} {namespace}/{ref.name} not found")
        env.update(
            {(source.prefix or "") + k: v for k, v in data.items() if _ENV_NAME.match((source.prefix or "") + k)}
        )
    for var in container.env or []:
        value: str | None
        if var.value_from is None:
            value = _LOOPBACK_URL_HOST.sub(fields.pod_ip, expand(var.value or "", env))
        elif var.value_from.field_ref is not None:
            value = fields.field(var.value_from.field_ref.field_path)
        elif var.value_from.config_map_key_ref is not None:
            value = await _key(fetch, "configmap", namespace, var.value_from.config_map_key_ref)
        elif var.value_from.secret_key_ref is not None:
            value = await _key(fetch, "secret", namespace, var.value_from.secret_key_ref)
        else:
            raise ContainerConfigError(f"env {var.name}: resourceFieldRef is not supported by the loopback kubelet")
        if value is not None:
            env[var.name] = value
    return env
