"""FMA's release is used only as released: each binary checked against the release's SHA256SUMS, and a missing or
altered one a clear error (the tests of FMA's components fail on it, they never skip)."""

import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e import fma_release


@pytest.fixture
def release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A release folder of one binary, `bin/requester`, listed in its SHA256SUMS."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "requester").write_bytes(b"the requester")
    digest = hashlib.sha256(b"the requester").hexdigest()
    (tmp_path / "SHA256SUMS").write_text(f"{digest}  bin/requester\n")
    monkeypatch.setenv("DUALPODS_FMA_RELEASE", str(tmp_path))
    fma_release.binary.cache_clear()
    yield tmp_path
    fma_release.binary.cache_clear()  # the real release's binaries are checked again on their next use


def test_a_binary_that_matches_its_sum_is_used(release: Path) -> None:
    assert fma_release.binary("requester") == release / "bin" / "requester"


def test_an_altered_binary_is_refused(release: Path) -> None:
    (release / "bin" / "requester").write_bytes(b"something else")
    with pytest.raises(fma_release.FmaReleaseError, match="not FMA's release"):
        fma_release.binary("requester")


def test_a_missing_or_unlisted_binary_is_named(release: Path) -> None:
    with pytest.raises(fma_release.FmaReleaseError, match="bin/test-server is not listed"):
        fma_release.binary("test-server")
    (release / "bin" / "requester").unlink()
    with pytest.raises(fma_release.FmaReleaseError, match="requester is missing"):
        fma_release.binary("requester")


def test_a_missing_release_says_where_it_was_looked_for(release: Path) -> None:
    shutil.rmtree(release)
    with pytest.raises(fma_release.FmaReleaseError, match=f"is not at {release}"):
        fma_release.binary("requester")
