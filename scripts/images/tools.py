"""The container tools (buildah, podman, runc, mmdebstrap) and the flags this kind of machine needs.

Debian packages them; `ensure_installed` installs what is missing with apt-get (as root), so `make images`
works on a fresh machine. Every build and run goes through runc, not crun (podman's default fails here:
"cgroups in hybrid mode not supported"), and asks for file and process limits no higher than the
machine's own (podman's defaults are higher, and raising them needs CAP_SYS_RESOURCE, which is absent).
"""

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scripts.build_cache import cache_root

PACKAGES = {"buildah": "buildah", "podman": "podman", "runc": "runc", "mmdebstrap": "mmdebstrap"}
RUNC = "/usr/sbin/runc"
# What `podman run` and `buildah bud` need on this machine (../shared/reference/containers.md).
MACHINE_FLAGS = ["--runtime", RUNC, "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]


class ToolError(RuntimeError):
    """A container tool is missing or failed; the message says what to do."""


@contextlib.contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """Held by one process of the machine at a time (an flock under the cache). `make test` builds the images
    beside the e2e tests, and the tests that need an image build it on demand: they take turns, and the later
    one finds the image up to date instead of building it a second time."""
    path = cache_root() / "images" / f".{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def missing() -> list[str]:
    return [package for command, package in PACKAGES.items() if shutil.which(command) is None]


def ensure_installed() -> None:
    """Install the Debian packages of the tools that are not on PATH (apt-get; needs root)."""
    packages = missing()
    if not packages:
        return
    if os.geteuid() != 0:
        raise ToolError(f"{', '.join(packages)} missing: run `apt-get install -y {' '.join(packages)}` as root")
    print(f"installing {', '.join(packages)} with apt-get", file=sys.stderr, flush=True)
    install = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(install, env=env, stdout=subprocess.DEVNULL, check=False).returncode != 0:
        run(["apt-get", "update"], quiet=True)  # a fresh machine's package lists may be stale or empty
        run(install, quiet=True, env=env)
    if missing():
        raise ToolError(f"apt-get installed {packages} but {missing()} are still not on PATH")


def run(argv: list[str], *, quiet: bool = False, env: dict[str, str] | None = None) -> str:
    """Run a command (its output shown, or with `quiet` kept and shown only if it fails); its stdout."""
    done = subprocess.run(argv, capture_output=quiet, text=True, env=env, check=False)
    if done.returncode != 0:
        detail = f":\n{done.stdout}{done.stderr}" if quiet else ""
        raise ToolError(f"`{shlex.join(argv)[:300]}` exited with {done.returncode}{detail}")
    return done.stdout or ""


def run_logged(argv: list[str], log: Path) -> None:
    """Run a command with its output in `log`; ToolError with the log's tail when it fails."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise ToolError(f"`{shlex.join(argv)[:300]}` exited with {code}; the end of {log}:\n{tail}")


def output(argv: list[str]) -> str:
    """A command's stdout; ToolError with its stderr when it fails."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ToolError(f"{' '.join(argv)} exited with {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def image_exists(reference: str) -> bool:
    return subprocess.run(["podman", "image", "exists", reference], check=False).returncode == 0


def inspect(reference: str) -> dict[str, Any] | None:
    """`podman image inspect` of one image, or None when it is not in local storage."""
    if not image_exists(reference):
        return None
    found: list[dict[str, Any]] = json.loads(output(["podman", "image", "inspect", reference]))
    return found[0]


def label(reference: str, name: str) -> str | None:
    image = inspect(reference)
    if image is None:
        return None
    labels: dict[str, str] = image.get("Labels") or {}
    return labels.get(name)
