"""A container's securityContext, merged with its Pod's as the kubelet merges them, and what each runtime makes
of it, so that what the chart asks for (Pod Security "restricted") is tested rather than ignored.

The OCI runtime applies all of it with podman: the user (`runAsUser`/`runAsGroup`), `runAsNonRoot` checked
against the user the container would run as (the kubelet's CreateContainerConfigError), a read-only root file
system without podman's own tmpfs mounts (Kubernetes adds none: only volumes are writable), dropped and added
capabilities, and no_new_privileges for `allowPrivilegeEscalation: false`. podman's default seccomp profile is
the runtime's default. The process runtime runs a local process as the kubelet's own user: it applies the
read-only root (every mount of the container's mount namespace made read-only except its volumes, /dev, /proc
and /sys), which is what tells whether a program writes outside its volumes; users and capabilities it cannot
emulate.
"""

from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client

from e2e.kubelet.env import ContainerConfigError


@dataclass(frozen=True)
class Security:
    run_as_user: int | None = None
    run_as_group: int | None = None
    run_as_non_root: bool = False
    read_only_root: bool = False
    no_new_privileges: bool = False
    drop: tuple[str, ...] = ()
    add: tuple[str, ...] = ()

    @classmethod
    def of(cls, pod: client.V1Pod, container: client.V1Container) -> "Security":
        """The container's settings, falling back to the Pod's where the container has none."""
        pod_context = pod.spec.security_context or client.V1PodSecurityContext()
        own = container.security_context or client.V1SecurityContext()

        def setting(name: str) -> Any:
            value = getattr(own, name)
            return value if value is not None else getattr(pod_context, name, None)

        capabilities = own.capabilities or client.V1Capabilities()
        return cls(
            run_as_user=setting("run_as_user"),
            run_as_group=setting("run_as_group"),
            run_as_non_root=bool(setting("run_as_non_root")),
            read_only_root=bool(own.read_only_root_filesystem),
            no_new_privileges=own.allow_privilege_escalation is False,
            drop=tuple(capabilities.drop or ()),
            add=tuple(capabilities.add or ()),
        )

    def check_non_root(self, image_user: str) -> None:
        """The kubelet's runAsNonRoot check: the container's user (its own, else the image's) must be a non-zero
        UID; a user name cannot be verified, so it is refused too."""
        if not self.run_as_non_root:
            return
        if self.run_as_user is not None:
            if self.run_as_user == 0:
                raise ContainerConfigError("container's runAsUser breaks non-root policy (pod: runAsNonRoot)")
            return
        user = image_user.partition(":")[0] or "0"
        if not user.isdigit():
            raise ContainerConfigError(f"container has runAsNonRoot and image has non-numeric user ({user}), "
                                       "cannot verify user is non-root")  # fmt: skip
        if int(user) == 0:
            raise ContainerConfigError("container has runAsNonRoot and image will run as root")

    def podman_flags(self) -> list[str]:
        flags = []
        if self.run_as_user is not None:
            group = f":{self.run_as_group}" if self.run_as_group is not None else ""
            flags.append(f"--user={self.run_as_user}{group}")
        if self.read_only_root:
            flags += ["--read-only", "--read-only-tmpfs=false"]
        if self.no_new_privileges:
            flags.append("--security-opt=no-new-privileges")
        flags += [f"--cap-drop={c}" for c in self.drop] + [f"--cap-add={c}" for c in self.add]
        return flags
