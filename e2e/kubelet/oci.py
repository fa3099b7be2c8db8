"""A container as a real OCI container: a Pod's image from local container storage, run with podman and runc.

The loopback kubelet's second container runtime. When a Pod's image is in local storage (`podman image
exists`, e.g. after `make images`), its container runs from that image exactly as the image's Dockerfile
says (entrypoint, user, working directory, environment), with the Pod's `command`/`args` in Docker's places
and its securityContext applied (security.py); otherwise the process runtime (`container.py`) runs the image
map's local command. Either way the container gets the same environment, volumes (the service-account token
among them), GPU variables, probes, restarts, grace periods and log file. Networking is the host's
(`--network host`): a process in the container binds its Pod's own 127.x address as a local process does,
and nothing leaves loopback.

`podman run` stays attached: its output is the container's, written to the kubelet's log file, and its
exit status is the container's (128 + N after signal N). Containers are named and labelled after the
kubelet that started them (`io.dualpods.kubelet`), and never outlive it: a watchdog process holds the
read end of a pipe the kubelet never writes; when the kubelet exits, however it dies, the pipe closes
and the watchdog removes every container with the kubelet's label (`podman rm -f`). A kubelet starting
on the same state directory removes what an earlier one left, too.
"""

import asyncio
import contextlib
import datetime
import hashlib
import json
import logging
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from api.tasks import Background
from e2e.kubelet.container import exit_code
from e2e.kubelet.security import Security
from e2e.kubelet.volumes import Mount
from scripts.images.tools import MACHINE_FLAGS

log = logging.getLogger(__name__)

OWNER_LABEL = "io.dualpods.kubelet"
CONTAINER_ID_SCHEME = "podman://"
# Variables podman itself reads: a container's value for one of them goes on podman's command line, not
# into podman's own environment (secret values never do: they are passed through podman's environment).
_PODMAN_READS = ("PATH", "HOME", "TMPDIR", "XDG_", "CONTAINERS_", "STORAGE_", "BUILDAH_", "REGISTRY_", "LD_")
_GONE_POLL_SECONDS = 0.5
ENABLED_MESSAGE = "images in local container storage run as OCI containers, labelled"


def podman_available() -> bool:
    return shutil.which("podman") is not None


def enabled_in(kubelet_log: Path) -> bool:
    """Whether the kubelet that wrote `kubelet_log` runs local images as OCI containers (it found podman)."""
    return kubelet_log.is_file() and ENABLED_MESSAGE in kubelet_log.read_text(errors="replace")


def owner_id(state_dir: Path) -> str:
    """The label value of one kubelet's containers: its state directory, hashed."""
    return hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]


def remove_owned_command(owner: str) -> list[str]:
    return ["podman", "rm", "--force", "--time=0", f"--filter=label={OWNER_LABEL}={owner}"]


def remove_owned(owner: str) -> None:
    """Remove every container `owner`'s kubelet started (what a dead kubelet left behind)."""
    subprocess.run(remove_owned_command(owner), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def start_watchdog(owner: str) -> "subprocess.Popen[bytes]":
    """A process that removes `owner`'s containers once this process has exited (its stdin closes then)."""
    removal = shlex.join(remove_owned_command(owner))
    return subprocess.Popen(
        ["sh", "-c", f"cat >/dev/null; exec {removal} >/dev/null 2>&1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # signals to the kubelet's process group do not reach it
    )


async def _podman_within(limit: float, *args: str) -> tuple[int, str]:
    """podman's exit code and output; TimeoutError (podman killed) when it takes longer than `limit`."""
    pipe, devnull = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL
    process = await asyncio.create_subprocess_exec(
        "podman", *args, stdin=devnull, stdout=pipe, stderr=asyncio.subprocess.STDOUT
    )
    try:
        async with asyncio.timeout(limit):
            output, _ = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    return process.returncode or 0, output.decode(errors="replace")


async def _podman(*args: str, limit: float = 60.0) -> tuple[int, str]:
    try:
        return await _podman_within(limit, *args)
    except TimeoutError:
        return 1, f"podman {args[0]} timed out after {limit} s"


IMAGE_LOOKUP_LIMIT_S = 5.0
_last_lookup: dict[str, bool] = {}  # per image, this kubelet's last answer from podman


async def image_exists(image: str) -> bool:
    """Whether `image` is in local container storage (never pulled: there is no registry here). podman waits
    for the storage's lock, which an image build beside the tests holds while it commits a layer (a minute
    and more under load): a lookup slower than IMAGE_LOOKUP_LIMIT_S gives the image's last answer (else: not
    there), so that a container whose image was never seen local starts as a process instead of waiting for
    the build (one from a local image still waits: `podman run` needs that lock too)."""
    try:
        code, _ = await _podman_within(IMAGE_LOOKUP_LIMIT_S, "image", "exists", image)
    except TimeoutError:
        known = _last_lookup.get(image, False)
        log.warning("podman did not say within %g s whether image %s is local; as last seen: %s",
                    IMAGE_LOOKUP_LIMIT_S, image, known)  # fmt: skip
        return known
    _last_lookup[image] = code == 0
    return code == 0


async def image_user(image: str) -> str:
    """The user the image runs as (its USER; "" for root by default)."""
    code, output = await _podman("image", "inspect", "--format={{.Config.User}}", image)
    return output.strip() if code == 0 else ""


@dataclass(frozen=True)
class OciSpec:
    """What one run of a container needs, resolved from the Pod."""

    name: str  # the podman container name, unique per run
    image: str
    command: list[str] | None  # replaces the image's entrypoint (and drops its cmd)
    args: list[str] | None  # replace the image's cmd
    env: dict[str, str]
    hostname: str
    mounts: list[Mount]
    working_dir: str | None
    labels: dict[str, str] = field(default_factory=dict)
    security: Security = field(default_factory=Security)

    def argv(self) -> tuple[list[str], dict[str, str]]:
        """`podman run ...` and the environment to run it with (which carries the container's values)."""
        environment = {name: os.environ[name] for name in ("PATH", "HOME", "XDG_RUNTIME_DIR") if name in os.environ}
        argv = ["podman", "run", "--rm", "--name", self.name, "--pull=never", "--network=host", "--log-driver=none"]
        argv += [*MACHINE_FLAGS, *self.security.podman_flags(), "--hostname", self.hostname]
        argv += [f"--label={key}={value}" for key, value in sorted(self.labels.items())]
        for variable, value in self.env.items():
            if variable.startswith(_PODMAN_READS):
                argv.append(f"--env={variable}={value}")
            else:
                environment[variable] = value
                argv.append(f"--env={variable}")
        for mount in self.mounts:
            readonly = ",readonly=true" if mount.read_only else ""
            argv.append(f"--mount=type=bind,source={mount.source},destination={mount.target}{readonly}")
        if self.working_dir:
            argv.append(f"--workdir={self.working_dir}")
        if self.command:
            argv.append(f"--entrypoint={json.dumps(self.command)}")
        return [*argv, self.image, *(self.args or [])], environment


class OciContainer:
    """One run of a container under podman; the same surface as `ContainerProcess`."""

    def __init__(self, spec: OciSpec, process: asyncio.subprocess.Process) -> None:
        self.spec = spec
        self._process = process
        self.started_at = datetime.datetime.now(datetime.UTC)
        self._removals = Background()  # of a killed container, which `kill` cannot wait for

    @classmethod
    async def start(cls, spec: OciSpec, log: Path) -> "OciContainer":
        log.parent.mkdir(parents=True, exist_ok=True)
        argv, environment = spec.argv()
        with log.open("ab") as out:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                env=environment,
                start_new_session=True,
            )
        return cls(spec, process)

    @property
    def container_id(self) -> str:
        return f"{CONTAINER_ID_SCHEME}{self.spec.name}"

    async def wait(self) -> int:
        return exit_code(await self._process.wait())

    def _running(self) -> bool:
        return self._process.returncode is None

    async def stop(self, grace_seconds: float) -> int:
        """SIGTERM to the container's first process, then removal with SIGKILL after the grace period."""
        if self._running():
            await _podman("kill", "--signal=TERM", self.spec.name)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(grace_seconds, 0.0)):
                    return await self.wait()
        while self._running():  # also a container that podman had not created yet when TERM was sent
            await _podman("rm", "--force", "--time=0", self.spec.name)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_GONE_POLL_SECONDS):
                    return await self.wait()
        return await self.wait()

    def kill(self) -> None:
        """SIGKILL at once (podman removes the container; its `podman run` then exits with 137)."""
        if self._running():
            self._removals.start(_podman("rm", "--force", "--time=0", self.spec.name), name=f"remove {self.spec.name}")

    async def exec(self, argv: list[str], *, env: dict[str, str], cwd: Path, limit: float) -> tuple[int, str]:
        """Run `argv` in the container (exec probes, preStop hooks) with its own environment and directory."""
        code, output = await _podman("exec", self.spec.name, *argv, limit=limit)
        return exit_code(code), output
