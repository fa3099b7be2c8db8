"""Pod volumes as host directories: Secret, ConfigMap, downwardAPI and emptyDir are written under the Pod's
directory, hostPath is used in place. `container.py` bind-mounts them in the container's mount namespace."""

import shutil
from dataclasses import dataclass
from pathlib import Path

from kubernetes_asyncio import client

from e2e.kubelet.env import Fetch, PodFields


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


async def materialize(pod: client.V1Pod, pod_dir: Path, fields: PodFields, fetch: Fetch) -> dict[str, Path]:
    """Host path of every volume of `pod`; raises VolumeError naming the first one that fails."""
    namespace = pod.metadata.namespace
    paths: dict[str, Path] = {}
    for volume in pod.spec.volumes or []:
        directory = pod_dir / "volumes" / volume.name
        if volume.empty_dir is not None:
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(0o777)  # as a kubelet makes it: writable by a container's non-root user
        elif volume.host_path is not None:
            directory = Path(volume.host_path.path)
            if volume.host_path.type in ("DirectoryOrCreate", None, "") and not directory.exists():
                directory.mkdir(parents=True)
            if not directory.exists():
                raise VolumeError(f"volume {volume.name}: hostPath {directory} does not exist")
        elif volume.secret is not None or volume.config_map is not None:
            source = volume.secret or volume.config_map
            kind = "secret" if volume.secret is not None else "configmap"
            name = volume.secret.secret_name if volume.secret is not None else volume.config_map.name
            data = await fetch(kind, namespace, name)
            if data is None and not source.optional:
                raise VolumeError(f"volume {volume.name}: {kind} {namespace}/{name} not found")
            mode = source.default_mode if source.default_mode is not None else 0o644
            _write_files(directory, _project(data or {}, source.items, f"volume {volume.name}"), mode)
        elif volume.downward_api is not None:
            files = {}
            for item in volume.downward_api.items or []:
                if item.field_ref is None:
                    raise VolumeError(f"volume {volume.name}: only fieldRef items are supported")
                files[item.path] = fields.field(item.field_ref.field_path)
            _write_files(directory, files, volume.downward_api.default_mode or 0o644)
        else:
            kinds = [k for k, v in volume.to_dict().items() if v is not None and k != "name"]
            raise VolumeError(
                f"volume {volume.name}: type {', '.join(kinds) or 'unknown'} is not supported by the loopback "
                "kubelet (supported: emptyDir, hostPath, secret, configMap, downwardAPI)"
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
