"""Each component's Dockerfile starts the same command the loopback kubelet runs for its image, so
what the tests exercise is what a cluster runs (images cannot be built here: no Docker engine)."""

import json
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
IMAGE_MAP = yaml.safe_load((REPO / "e2e" / "kubelet" / "images.yaml").read_text())["images"]


def entrypoint(dockerfile: Path) -> list[str]:
    (line,) = re.findall(r"^ENTRYPOINT (\[.*\])$", dockerfile.read_text(), flags=re.MULTILINE)
    command: list[str] = json.loads(line)
    return command


@pytest.mark.parametrize(
    ("dockerfile", "image"),
    [
        ("controller.Dockerfile", "dualpods/controller"),
        ("requester.Dockerfile", "dualpods/requester"),
        ("launcher-cpu.Dockerfile", "dualpods/launcher"),
        ("launcher-gpu.Dockerfile", "dualpods/launcher"),
    ],
)
def test_the_entrypoint_is_the_one_the_loopback_kubelet_runs(dockerfile: str, image: str) -> None:
    command = entrypoint(REPO / "images" / dockerfile)
    expected = IMAGE_MAP[image]["entrypoint"]
    assert command[0] in ("python", "python3")
    assert expected[0] == "{python}"
    assert command[1:] == expected[1:]


def test_every_python_package_an_image_copies_exists() -> None:
    for dockerfile in (REPO / "images").glob("*.Dockerfile"):
        for source in re.findall(r"^COPY (\S+) ", dockerfile.read_text(), flags=re.MULTILINE):
            assert (REPO / source).exists(), f"{dockerfile.name} copies {source}, which does not exist"


@pytest.mark.parametrize("dockerfile", ["launcher-cpu.Dockerfile", "launcher-gpu.Dockerfile"])
def test_launcher_images_have_fmas_entry_points_in_their_working_directory(dockerfile: str) -> None:
    """FMA's controllers run `python3 launcher.py` there and the sidecar `python3 /app/launcher_pod_notifier.py`;
    the loopback kubelet gives the launcher image the same files (images/fma-app, checked in test_fma_commands)."""
    text = (REPO / "images" / dockerfile).read_text()
    assert re.findall(r"^WORKDIR (\S+)$", text, flags=re.MULTILINE)[-1] == "/app"
    assert "RUN python3 -m launcher.fma_compat /app" in text
    assert IMAGE_MAP["dualpods/launcher"]["workingDir"] == "/app"
    assert IMAGE_MAP["dualpods/launcher"]["files"] == {"/app": "{repo}/images/fma-app"}
