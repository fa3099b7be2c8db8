"""A container as a local process: its own mount, UTS and PID namespaces, bind-mounted volumes, a log file.

The PID namespace makes the container's process PID 1, as in a real container: it gets SIGTERM only if
it handles it, and when it dies the kernel kills everything it started. `--pdeathsig KILL` ties the
container to the kubelet, so a killed kubelet leaves no process behind.
"""

import asyncio
import contextlib
import datetime
import os
import shlex
import signal
from pathlib import Path

import psutil

from e2e.kubelet.volumes import Mount

_NAMESPACES = ["unshare", "--mount", "--uts", "--pid", "--fork", "--kill-child", "--mount-proc"]


def exit_code(returncode: int) -> int:
    """Container runtimes report death by signal N as 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


# Under a read-only root these stay writable, as in a container: devices, the kernel's views, and the volumes.
_KERNEL_MOUNTS = ("/dev", "/proc", "/sys")


def _read_only_root(volume_targets: list[str]) -> list[str]:
    """Shell lines making every other mount of the namespace read-only (`/` first: it must work)."""
    keep = " ".join(shlex.quote(t) for t in [*_KERNEL_MOUNTS, *volume_targets])
    return [
        "mount -o remount,bind,ro /",
        "awk '{print $5}' /proc/self/mountinfo | sort -u | while read -r point; do",
        f'  for kept in {keep}; do case $point in "$kept"|"$kept"/*) continue 2;; esac; done',
        '  [ "$point" = / ] || mount -o remount,bind,ro "$point" 2>/dev/null || true',
        "done",
    ]


def _under(path: str, directory: str) -> bool:
    directory = directory.rstrip("/") or "/"
    return directory == "/" or path == directory or path.startswith(directory + "/")


def _setup_script(hostname: str, mounts: list[Mount], workdir: str | None, read_only_root: bool = False) -> str:
    """Shell run as the namespace's first process: hostname, bind mounts, a read-only root if asked for, the
    working directory, then exec the command.

    A volume mounted over a directory hides what the directory held: a Pod mounting an emptyDir at /tmp hides
    the kubelet's state under /tmp, where later volumes' sources are. Such sources are opened before anything is
    mounted and bound through their file descriptors (the shell has 3 to 9)."""
    lines = ["set -e", f"hostname {shlex.quote(hostname)}"]
    sources: list[str] = []
    descriptors = range(3, 10)
    for index, mount in enumerate(mounts):
        source = str(mount.source)
        if any(_under(source, earlier.target) for earlier in mounts[:index]):
            if not descriptors:
                raise ValueError("too many volumes hidden by other volumes of the same container")
            descriptor, descriptors = descriptors[0], descriptors[1:]
            lines.append(f"exec {descriptor}< {shlex.quote(source)}")
            source = f"/proc/self/fd/{descriptor}"
        sources.append(source)
    for mount, source in zip(mounts, sources, strict=True):
        target = shlex.quote(mount.target)
        make = "mkdir -p" if mount.source.is_dir() else "mkdir -p $(dirname " + target + ") && touch"
        lines.append(f"[ -e {target} ] || {make} {target}")
        # A descriptor's path is taken as it is: mount(8) would resolve it to the (now hidden) name it points at.
        verbatim = " --no-canonicalize" if source.startswith("/proc/self/fd/") else ""
        lines.append(f"mount{verbatim} --bind {shlex.quote(source)} {target}")
        if mount.read_only:
            lines.append(f"mount -o remount,bind,ro {target}")
    if read_only_root:
        lines += _read_only_root([m.target.rstrip("/") or "/" for m in mounts])
    if workdir:
        lines.append(f"cd {shlex.quote(workdir)}")
    if descriptors != range(3, 10):
        lines.append("exec " + " ".join(f"{d}<&-" for d in range(3, descriptors.start)))  # not for the command
    lines.append('exec "$@"')
    return "\n".join(lines)


class ContainerProcess:
    """One run of a container's process."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process
        self.pid = process.pid
        self.started_at = datetime.datetime.now(datetime.UTC)

    @classmethod
    async def start(
        cls,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: Path,
        workdir: str | None = None,
        hostname: str,
        mounts: list[Mount],
        log: Path,
        read_only_root: bool = False,
    ) -> "ContainerProcess":
        log.parent.mkdir(parents=True, exist_ok=True)
        command = [
            "setpriv",
            "--pdeathsig",
            "KILL",
            "--",
            *_NAMESPACES,
            "sh",
            "-c",
            _setup_script(hostname, mounts, workdir, read_only_root),
            "container",
            *argv,
        ]
        with log.open("ab") as out:
            process = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        return cls(process)

    @property
    def container_id(self) -> str:
        return f"loopback://{self.pid}"

    async def wait(self) -> int:
        return exit_code(await self._process.wait())

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    async def stop(self, grace_seconds: float) -> int:
        """SIGTERM to the container's PID 1 alone, as a container runtime sends it (what PID 1 started hears of it
        from PID 1, and a PID 1 that ignores it, as FMA's notifier sidecar does, lives out the grace period), then
        SIGKILL after the grace period (the whole namespace dies with its first process)."""
        if self._process.returncode is None:
            init = self._namespace_init()
            if init is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(init, signal.SIGTERM)
            try:
                async with asyncio.timeout(max(grace_seconds, 0.0)):
                    return await self.wait()
            except TimeoutError:
                pass
        self.kill()
        return await self.wait()

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _namespace_init(self) -> int | None:
        """Host PID of the process that is PID 1 inside the container."""
        try:
            children = psutil.Process(self.pid).children()
        except psutil.NoSuchProcess:
            return None
        return children[0].pid if children else None

    async def exec(self, argv: list[str], *, env: dict[str, str], cwd: Path, limit: float) -> tuple[int, str]:
        """Run `argv` inside the container's namespaces (exec probes); returns (exit code, output)."""
        target = self._namespace_init()
        if target is None:
            return 1, "container process is not running"
        process = await asyncio.create_subprocess_exec(
            "nsenter",
            f"--target={target}",
            "--mount",
            "--uts",
            "--pid",
            "--",
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        try:
            async with asyncio.timeout(limit):  # not wait_for, which can lose the cancellation of a probe loop
                output, _ = await process.communicate()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
            return 1, f"timed out after {limit} s"
        return exit_code(process.returncode or 0), output.decode(errors="replace")
