"""The image map: which local command line stands in for a container image (no image can be pulled here).

A YAML file maps an image to Docker's two halves of a command line, `entrypoint` and `cmd`; a Pod's `command`
replaces the entrypoint and its `args` replace the cmd, as Docker does. Keys are image repositories without tag
(`python`, `dualpods/test-http`); a key with a tag (`python:3.12`) wins over the bare repository for that tag only.
`docker.io/`, `library/` and `localhost/` (podman's name for locally built images) prefixes are ignored. Strings
may hold `{python}` (the kubelet's interpreter), `{venv_bin}` (its directory), `{repo}` (the repository root),
`{fma}` (FMA's release beside it, e2e/fma_release.py) and `{fma_launcher_bin}` (the environment of FMA's launcher,
e2e/fma_launcher_env.py); `env` values may also hold `{pod_ip}`, the Pod's address: every Pod shares the host's
loopback network, so a program that binds all addresses by default is told its Pod's address this way, as an
image's own default (the Pod's env still wins). An entry's `files` stand for the image's own files: host
directories (placeholders allowed) bind-mounted read-only at container paths, under the Pod's volumes; `workingDir`
is the image's working directory (Docker's WORKDIR), where its process starts unless the Pod names another. An
image with no entry runs as a pause container: no process, always Running.
"""

import functools
import os
import sys
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from e2e.fma_launcher_env import venv_bin
from e2e.fma_release import release_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_IMAGE_MAP = Path(__file__).with_name("images.yaml")


class ImageMapError(ValueError):
    """An image map file that cannot be used; says which file and entry."""


class ImageEntry(BaseModel):
    """How to run one image."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    entrypoint: list[str] = Field(default_factory=list)
    cmd: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    files: dict[str, str] = Field(default_factory=dict)  # container path -> host directory
    working_dir: str | None = Field(default=None, alias="workingDir")


class ImageMapFile(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    pass_env: list[str] = Field(default_factory=list, alias="passEnv")
    images: dict[str, ImageEntry] = Field(default_factory=dict)


POD_IP_PLACEHOLDER = "{pod_ip}"


@functools.cache  # read at every container start (its PATH); the lock's hash behind `fma_launcher_bin` once
def placeholders() -> dict[str, str]:
    python = Path(sys.executable)
    # `{pod_ip}` is filled per Pod (in env values only), so it survives the load-time fill unchanged.
    return {
        "python": str(python), "venv_bin": str(python.parent), "repo": str(REPO_ROOT), "fma": str(release_dir()),
        "fma_launcher_bin": str(venv_bin()), "pod_ip": POD_IP_PLACEHOLDER,
    }  # fmt: skip


def _fill(text: str, where: str) -> str:
    try:
        return text.format_map(placeholders())
    except (KeyError, ValueError, IndexError) as error:
        raise ImageMapError(
            f"{where}: bad placeholder in {text!r} ({error}); known: {sorted(placeholders())}"
        ) from None


def repository_and_tag(image: str) -> tuple[str, str | None]:
    """`docker.io/library/python:3.12@sha256:...` -> ("python", "3.12")."""
    name = image.split("@", 1)[0]
    tag = None
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = name.rsplit(":", 1)
    for prefix in ("docker.io/", "index.docker.io/", "localhost/", "library/"):
        name = name.removeprefix(prefix)
    return name, tag


class ImageMap:
    """All entries of one or more image map files (later files override earlier ones)."""

    def __init__(self, files: list[Path]) -> None:
        self.images: dict[str, ImageEntry] = {}
        self.pass_env: list[str] = []
        for path in files:
            try:
                parsed = ImageMapFile.model_validate(yaml.safe_load(path.read_text()) or {})
            except (OSError, yaml.YAMLError, ValidationError) as error:
                raise ImageMapError(f"image map {path}: {error}") from None
            self.pass_env += parsed.pass_env
            for image, entry in parsed.images.items():
                where = f"image map {path}, entry {image!r}"
                self.images[image] = ImageEntry(
                    entrypoint=[_fill(a, where) for a in entry.entrypoint],
                    cmd=[_fill(a, where) for a in entry.cmd],
                    env={k: _fill(v, where) for k, v in entry.env.items()},
                    files={target: _fill(source, where) for target, source in entry.files.items()},
                    working_dir=entry.working_dir,
                )

    def lookup(self, image: str) -> ImageEntry | None:
        """The entry for `image`, or None: a pause container."""
        repository, tag = repository_and_tag(image)
        if tag is not None and f"{repository}:{tag}" in self.images:
            return self.images[f"{repository}:{tag}"]
        return self.images.get(repository)

    def image_env(self, entry: ImageEntry | None, pod_ip: str) -> dict[str, str]:
        """The host variables passed to every container, and the entry's own (the Pod's address filled in)."""
        env = {name: os.environ[name] for name in self.pass_env if name in os.environ}
        if entry is not None:
            env.update({name: value.replace(POD_IP_PLACEHOLDER, pod_ip) for name, value in entry.env.items()})
        return env

    def base_env(self, entry: ImageEntry, pod_ip: str) -> dict[str, str]:
        """What a local process for the image starts with, before the kubelet's and the Pod's variables (a
        real image brings its own PATH, HOME and LANG)."""
        env = {
            "PATH": f"{placeholders()['venv_bin']}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
        }
        return {**env, **self.image_env(entry, pod_ip)}


def command_line(entry: ImageEntry, command: list[str] | None, args: list[str] | None) -> list[str]:
    """Docker's rule: `command` replaces the entrypoint (and drops cmd), `args` replace cmd."""
    if command:
        return [*command, *(args or [])]
    return [*entry.entrypoint, *(args if args else entry.cmd)]
