"""FMA's released components, used where they lie beside the checkout (`../shared/fma/<version>`), never copied.

The release folder holds FMA's own binaries, launcher, chart and CRDs, built from FMA's tagged source; its
SHA256SUMS lists the binaries. Every binary is checked against it before it is run, so a test that needs FMA's
components fails with a message naming the missing or altered file: it never skips, and it never runs something
else under FMA's name. `DUALPODS_FMA_RELEASE` points at another copy of the same release.
"""

import functools
import hashlib
import os
from pathlib import Path

FMA_VERSION = "v0.6.5-alpha.1"
FMA_COMMIT = "553c7b73d70c4bacadc988f35bead7a233eea242"  # the tag, as the release's README records it
REPO = Path(__file__).resolve().parents[1]


class FmaReleaseError(RuntimeError):
    """FMA's release is missing, incomplete or not the one its SHA256SUMS describes."""


def release_dir() -> Path:
    return Path(os.environ.get("DUALPODS_FMA_RELEASE", REPO.parent / "shared" / "fma" / FMA_VERSION))


@functools.cache
def _sums(directory: Path) -> dict[str, str]:
    listing = directory / "SHA256SUMS"
    if not listing.is_file():
        raise FmaReleaseError(
            f"FMA {FMA_VERSION} is not at {directory} (no SHA256SUMS there): the tests of FMA's components run its "
            "released binaries from ../shared/fma/ beside the checkout, or from DUALPODS_FMA_RELEASE"
        )
    sums = {}
    for line in listing.read_text().splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            sums[name.lstrip("*")] = digest
    return sums


@functools.cache
def binary(name: str) -> Path:
    """FMA's command `name` (`dual-pods-controller`, `requester`, ...), once its SHA-256 matches the release's."""
    directory = release_dir()
    relative = f"bin/{name}"
    expected = _sums(directory).get(relative)
    if expected is None:
        raise FmaReleaseError(f"{relative} is not listed in {directory / 'SHA256SUMS'}")
    path = directory / relative
    if not path.is_file():
        raise FmaReleaseError(f"{path} is missing (listed in SHA256SUMS)")
    actual = hashlib.sha256(path.read_bytes()).hexdigest()
    if actual != expected:
        raise FmaReleaseError(f"{path} has SHA-256 {actual}, not {expected} as SHA256SUMS says: not FMA's release")
    return path


def chart() -> Path:
    """FMA's Helm chart `fma-controllers`."""
    path = release_dir() / "chart" / "fma-controllers"
    if not (path / "Chart.yaml").is_file():
        raise FmaReleaseError(f"FMA's chart is missing at {path}")
    return path


def launcher_dir() -> Path:
    """FMA's launcher: `launcher.py`, `gputranslator.py` and the notifier, as its image has them in /app."""
    path = release_dir() / "launcher"
    for name in ("launcher.py", "gputranslator.py", "launcher_pod_notifier.py"):
        if not (path / name).is_file():
            raise FmaReleaseError(f"FMA's launcher is incomplete: {path / name} is missing")
    return path
