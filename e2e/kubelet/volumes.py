"""Pod volumes as host directories: Secret, ConfigMap, downwardAPI, projected and emptyDir are written under the
Pod's directory, hostPath is used in place. `container.py` bind-mounts them in the container's mount namespace.

A projected volume is what the ServiceAccount admission plugin gives every Pod since Kubernetes 1.24
(`kube-api-access-*`: a bound ServiceAccount token, the `kube-root-ca.crt` ConfigMap and the namespace), so its
token comes from the TokenRequest API, bound to the Pod, as a kubelet asks for it. The token is written once: the
API server extends such tokens to a year (`--service-account-extend-token-expiration`), longer than any test.
"""

import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from e2e.kubelet.env import Fetch, PodFields

# (Pod, audience or None for the API server's own, expiration seconds) -> a token bound to the Pod.
TokenSource = Callable[[client.V1Pod, str | None, int], Awaitable[str]]


class VolumeError(RuntimeError):
    """A volume that cannot be set up (yet, or ever); reported as a FailedMount Event."""


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    read_only: bool


def _write_files(directory: Path, files: dict[str, str], mode: int) -> None:
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    for relative, content in files.items():
        path = directory / relative
        if path.resolve().parent != directory.resolve() and directory.resolve() not in path.resolve().parents:
            raise VolumeError(f"item path {relative!r} escapes the volume")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        path.chmod(mode)


def _project(data: dict[str, str], items: list[client.V1KeyToPath] | None, what: str) -> dict[str, str]:
    """`items` picks keys and renames them; without it every key becomes a file."""
    if not items:
        return dict(data)
    missing = [i.key for i in items if i.key not in data]
    if missing:
        raise VolumeError(f"{what}: keys {missing} not found")
    return {i.path: data[i.key] for i in items}


async def _object_files(kind: str, namespace: str, source: Any, what: str, fetch: Fetch) -> dict[str, str]:
    """The files of a Secret or ConfigMap volume or projection (nothing when it is optional and absent); only a
    Secret volume names its object `secretName`."""
    name = source.secret_name if isinstance(source, client.V1SecretVolumeSource) else source.name
    data = await fetch(kind, namespace, name)
    if data is None and not source.optional:
        raise VolumeError(f"{what}: {kind} {namespace}/{name} not found")
    return _project(data or {}, source.items, what)


def _downward_files(items: list[client.V1DownwardAPIVolumeFile] | None, fields: PodFields, what: str) -> dict[str, str]:
    files = {}
    for item in items or []:
        if item.field_ref is None:
            raise VolumeError(f"{what}: only fieldRef items are supported")
        files[item.path] = fields.field(item.field_ref.field_path)
    return files


async def _projected_files(
    pod: client.V1Pod, volume: client.V1Volume, fields: PodFields, fetch: Fetch, token: TokenSource
) -> dict[str, str]:
    files: dict[str, str] = {}
    what = f"volume {volume.name}"
    for source in volume.projected.sources or []:
        if source.secret is not None:
            files |= await _object_files("secret", pod.metadata.namespace, source.secret, what, fetch)
        elif source.config_map is not None:
            files |= await _object_files("configmap", pod.metadata.namespace, source.config_map, what, fetch)
        elif source.downward_api is not None:
            files |= _downward_files(source.downward_api.items, fields, what)
        elif source.service_account_token is not None:
            request = source.service_account_token
            files[request.path] = await token(pod, request.audience, request.expiration_seconds or 3600)
        else:
            kinds = [k for k, v in source.to_dict().items() if v is not None]
            raise VolumeError(f"{what}: projected source {', '.join(kinds)} is not supported by the loopback kubelet")
    return files


async def materialize(
    pod: client.V1Pod, pod_dir: Path, fields: PodFields, fetch: Fetch, token: TokenSource
) -> dict[str, Path]:
    """Host path of every volume of `pod`; raises VolumeError naming the first one that fails."""
    namespace = pod.metadata.namespace
    paths: dict[str, Path] = {}
    for volume in pod.spec.volumes or []:
        directory = pod_dir / "volumes" / volume.name
        what = f"volume {volume.name}"
        if volume.empty_dir is not None:
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(0o777)  # as a kubelet makes it: writable by a container's non-root user
        elif volume.host_path is not None:
            directory = Path(volume.host_path.path)
            if volume.host_path.type in ("DirectoryOrCreate", None, "") and not directory.exists():
                directory.mkdir(parents=True)
            if not directory.exists():
                raise VolumeError(f"{what}: hostPath {directory} does not exist")
        elif volume.secret is not None or volume.config_map is not None:
            kind = "secret" if volume.secret is not None else "configmap"
            source = volume.secret or volume.config_map
            files = await _object_files(kind, namespace, source, what, fetch)
            _write_files(directory, files, source.default_mode if source.default_mode is not None else 0o644)
        elif volume.downward_api is not None:
            files = _downward_files(volume.downward_api.items, fields, what)
            _write_files(directory, files, volume.downward_api.default_mode or 0o644)
        elif volume.projected is not None:
            files = await _projected_files(pod, volume, fields, fetch, token)
            mode = volume.projected.default_mode
            _write_files(directory, files, mode if mode is not None else 0o644)
        else:
            kinds = [k for k, v in volume.to_dict().items() if v is not None and k != "name"]
            raise VolumeError(
                f"{what}: type {', '.join(kinds) or 'unknown'} is not supported by the loopback "
                "kubelet (supported: emptyDir, hostPath, secret, configMap, downwardAPI, projected)"
            )
        paths[volume.name] = directory
    return paths


def container_mounts(container: client.V1Container, volumes: dict[str, Path]) -> list[Mount]:
    """The container's bind mounts, parents before children."""
    mounts = []
    for vm in container.volume_mounts or []:
        if vm.name not in volumes:
            raise VolumeError(f"container {container.name}: volumeMount {vm.name!r} names no volume")
        source = volumes[vm.name] / vm.sub_path if vm.sub_path else volumes[vm.name]
        if vm.sub_path and not source.exists():
            source.mkdir(parents=True)
        mounts.append(Mount(source, vm.mount_path, bool(vm.read_only)))
    return sorted(mounts, key=lambda m: m.target.rstrip("/").count("/"))
