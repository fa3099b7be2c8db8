"""The loopback kubelet asks podman whether a Pod's image is local (e2e/kubelet/oci.py) before each container
start. An image build beside the tests holds container storage's lock while it commits a layer, and podman
waits for it: in a cold three-worker run a launcher's restart waited a minute and its fault test failed. A
fake `podman` on PATH stands in for the held lock here (a real build cannot be made to hold it on demand)."""

import os
import time
from pathlib import Path

import pytest

from e2e.kubelet import oci


def fake_podman(directory: Path, script: str) -> None:
    podman = directory / "podman"
    podman.write_text(f"#!/bin/sh\n{script}\n")
    podman.chmod(0o755)


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(oci, "IMAGE_LOOKUP_LIMIT_S", 0.5)
    monkeypatch.setattr(oci, "_last_lookup", {})
    return tmp_path


async def test_a_lookup_held_by_the_storage_lock_gives_the_last_answer_at_once(bin_dir: Path) -> None:
    fake_podman(bin_dir, "exit 0")
    assert await oci.image_exists("dualpods/launcher:dev-cpu")
    fake_podman(bin_dir, "exec sleep 30")  # waits for the lock
    started = time.monotonic()
    assert await oci.image_exists("dualpods/launcher:dev-cpu")  # as last seen
    assert not await oci.image_exists("dualpods/never-looked-up")  # never seen: run it as a process
    assert time.monotonic() - started < 5.0


async def test_a_lookup_that_answers_replaces_the_last_answer(bin_dir: Path) -> None:
    fake_podman(bin_dir, "exit 0")
    assert await oci.image_exists("img")
    fake_podman(bin_dir, "exit 1")  # removed from storage
    assert not await oci.image_exists("img")
    fake_podman(bin_dir, "exec sleep 30")
    assert not await oci.image_exists("img")
