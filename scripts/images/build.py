"""Build one image with buildah, or leave it be when it is up to date.

An image carries the hash of everything it was built from (label `io.dualpods.build-inputs`): its
Dockerfile and target, its build arguments, its base image's ID, the closure it installs, the wheel's
hash and the wheelhouse. When the image in local storage carries the hash the inputs have now, nothing
is built. Otherwise buildah builds it with its layer cache, so a change to the project's code alone
rebuilds only the layer that installs the wheel, not the dependencies below it.
"""

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from scripts.images import tools, wheelhouse
from scripts.images.catalogue import ImageSpec

INPUTS_LABEL = "io.dualpods.build-inputs"


@dataclass(frozen=True)
class BuildResult:
    image: ImageSpec
    built: bool  # False: it was up to date
    seconds: float


def build_args(image: ImageSpec, base: str, source: str) -> dict[str, str]:
    args = {"BASE_IMAGE": base, "VERSION": wheelhouse.version(), "SOURCE": source}
    if image.target is not None:
        args["COMPONENT"] = image.target
    return args


def inputs_hash(image: ImageSpec, args: dict[str, str], context: Path, wheelhouse_dir: Path) -> str:
    base = tools.inspect(args["BASE_IMAGE"])
    inputs = {
        "dockerfile": (wheelhouse.REPO / image.dockerfile).read_text(),
        "target": image.target,
        "args": args,
        "base_id": base["Id"] if base else None,
        "closure": (context / "requirements" / f"{image.closure}.txt").read_text() if image.closure else None,
        "wheel": (context / "dist" / "SHA256SUMS").read_text() if image.installs_wheel else None,
        "wheelhouse": wheelhouse_dir.name,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def build(image: ImageSpec, args: dict[str, str], context: Path, wheelhouse_dir: Path, log: Path) -> BuildResult:
    """Build `image` from `context` (its output in `log`) unless it carries the hash of its inputs already."""
    started = time.monotonic()
    wanted = inputs_hash(image, args, context, wheelhouse_dir)
    if tools.label(image.reference, INPUTS_LABEL) == wanted:
        return BuildResult(image, built=False, seconds=time.monotonic() - started)
    argv = ["buildah", "bud", "--layers", "--pull=never", "--network=none", *tools.MACHINE_FLAGS]
    argv += [f"--build-arg={name}={value}" for name, value in sorted(args.items())]
    argv += [f"--label={INPUTS_LABEL}={wanted}", "--file", str(wheelhouse.REPO / image.dockerfile)]
    if image.target is not None:
        argv += ["--target", image.target]
    tools.run_logged([*argv, "--tag", image.reference, str(context)], log)
    return BuildResult(image, built=True, seconds=time.monotonic() - started)
