"""The Dockerfiles, read as text: each image starts the command the loopback kubelet's process runtime runs
for it, and builds from nothing but the build context `scripts.images` prepares (the wheel, a wheelhouse,
the closures), never from the checkout. What the built images do is tested in e2e/test_real_images.py."""

import json
import re
from pathlib import Path

import pytest
import yaml

from scripts.images import catalogue

REPO = Path(__file__).resolve().parents[1]
IMAGE_MAP = yaml.safe_load((REPO / "e2e" / "kubelet" / "images.yaml").read_text())["images"]
# What the context holds (scripts/images/wheelhouse.py: prepare_context).
CONTEXT_DIRS = ("requirements/", "dist", "wheelhouse")


def stages(dockerfile: Path) -> dict[str | None, str]:
    """Build stage name (None for an unnamed last stage) -> its text."""
    found: dict[str | None, str] = {}
    name: str | None = None
    for line in dockerfile.read_text().splitlines():
        start = re.match(r"^FROM \S+(?: AS (\S+))?$", line)
        if start:
            name = start.group(1)
            found[name] = ""
        elif found:
            found[name] += line + "\n"
    return found


def entrypoint(text: str) -> list[str]:
    (line,) = re.findall(r"^ENTRYPOINT (\[.*\])$", text, flags=re.MULTILINE)
    command: list[str] = json.loads(line)
    return command


@pytest.mark.parametrize(
    ("image", "image_map_key"),
    [
        (catalogue.CONTROLLER, "dualpods/controller"),
        (catalogue.REQUESTER, "dualpods/requester"),
        (catalogue.LAUNCHER_CPU, "dualpods/launcher"),
        (catalogue.LAUNCHER_GPU, "dualpods/launcher"),
    ],
    ids=lambda v: v.name if isinstance(v, catalogue.ImageSpec) else v,
)
def test_the_entrypoint_is_the_one_the_loopback_kubelet_runs(image: catalogue.ImageSpec, image_map_key: str) -> None:
    command = entrypoint(stages(REPO / image.dockerfile)[image.target])
    expected = IMAGE_MAP[image_map_key]["entrypoint"]
    assert command[0] in ("python", "python3")
    assert expected[0] == "{python}"
    assert command[1:] == expected[1:]


@pytest.mark.parametrize("dockerfile", sorted((REPO / "images").glob("*.Dockerfile")), ids=lambda p: p.name)
def test_images_build_from_the_context_alone(dockerfile: Path) -> None:
    """COPY and bind mounts name only what `scripts.images context` prepares; the base is a build argument."""
    text = dockerfile.read_text()
    copied = re.findall(r"^COPY (\S+) ", text, flags=re.MULTILINE)
    mounted = re.findall(r"--mount=type=bind,source=([^,]+),", text)
    assert copied or mounted
    for source in copied + mounted:
        assert source.startswith(CONTEXT_DIRS), f"{dockerfile.name} reads {source} from outside the build context"
    assert re.search(r"^ARG BASE_IMAGE=\S+$", text, flags=re.MULTILINE)
    assert "FROM ${BASE_IMAGE}" in text


def test_every_image_names_a_dockerfile_and_target_that_exist() -> None:
    for image in catalogue.IMAGES:
        assert image.target in stages(REPO / image.dockerfile), image.name
        assert image.base == catalogue.DEBIAN or image.base in catalogue.BY_NAME


@pytest.mark.parametrize("image", [catalogue.LAUNCHER_CPU, catalogue.LAUNCHER_GPU], ids=lambda image: image.name)
def test_launcher_images_have_fmas_entry_points_in_their_working_directory(image: catalogue.ImageSpec) -> None:
    """FMA's controllers run `python3 launcher.py` there and the sidecar `python3 /app/launcher_pod_notifier.py`;
    the loopback kubelet gives the launcher image the same files (images/fma-app, checked in test_fma_commands)."""
    text = (REPO / image.dockerfile).read_text()
    stage = stages(REPO / image.dockerfile)[image.target]
    assert re.findall(r"^WORKDIR (\S+)$", text, flags=re.MULTILINE)[-1] == "/app"
    assert "RUN python3 -m launcher.fma_compat /app" in stage
    assert IMAGE_MAP["dualpods/launcher"]["workingDir"] == "/app"
    assert IMAGE_MAP["dualpods/launcher"]["files"] == {"/app": "{repo}/images/fma-app"}
