"""A rotated launcher token reaches running launchers and controllers without a restart.

The token files are updated the way the kubelet updates a Secret volume (its AtomicWriter): the files are
symlinks into `..data`, itself a symlink to a timestamped directory, and an update writes a new directory and
renames a new `..data` over the old one. A real launcher process and the controllers' real LauncherClient follow
the change, in either order of the two kubelets' updates.
"""

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from api.keys import LAUNCHER_PORT
from api.token_file import TokenFile
from controller.http import HttpCaller, HttpError
from controller.launcher_client import LauncherClient
from e2e.kubelet.addresses import AddressBlock
from e2e.launcher_process import LauncherProcess


def write_secret_volume(volume: Path, token: str) -> None:
    """Create or update a Secret volume holding key `token`, atomically, as the kubelet does."""
    volume.mkdir(parents=True, exist_ok=True)
    stamp = volume / f"..{time.time_ns()}"
    stamp.mkdir()
    (stamp / "token").write_text(token)
    staged = volume / "..data_tmp"
    staged.symlink_to(stamp.name)
    staged.rename(volume / "..data")  # the one atomic step
    if not (volume / "token").is_symlink():
        (volume / "token").symlink_to("..data/token")


class Clock:
    """A settable clock: grace periods are tested without waiting them out."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_rotated_file_is_read_again_and_the_old_token_has_a_grace_period(tmp_path: Path) -> None:
    write_secret_volume(tmp_path, "first")
    clock = Clock()
    token = TokenFile(tmp_path / "token", grace_seconds=60, clock=clock)
    assert (token.current(), token.previous()) == ("first", None)
    assert token.accepts("first")
    assert not token.accepts("second")

    write_secret_volume(tmp_path, "second\n")
    assert (token.current(), token.previous()) == ("second", "first")
    assert token.accepts("second")
    assert token.accepts("first")  # a caller whose kubelet has not updated its copy yet
    clock.now += 61
    assert token.previous() is None
    assert not token.accepts("first")


def test_an_emptied_or_vanished_file_keeps_the_last_token(tmp_path: Path) -> None:
    write_secret_volume(tmp_path, "kept")
    token = TokenFile(tmp_path / "token")
    write_secret_volume(tmp_path, "")
    assert token.current() == "kept"
    os.unlink(tmp_path / "..data")
    assert token.current() == "kept"
    assert token.accepts("kept")


def test_without_a_file_the_fallback_serves_and_nothing_is_accepted_without_a_token(tmp_path: Path) -> None:
    made = TokenFile(tmp_path / "missing" / "token", fallback="just-created")
    assert made.current() == "just-created"
    write_secret_volume(tmp_path / "missing", "just-created")
    assert (made.current(), made.previous()) == ("just-created", None)  # the same token: no rotation
    nothing = TokenFile(tmp_path / "absent")
    assert nothing.current() == ""
    assert not nothing.accepts("")


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[LauncherProcess]:
    """A real launcher on its own loopback address and the launcher port (as in a Pod), reading its token from a
    kubelet-style Secret volume; a replaced token stays valid for 3 s."""
    write_secret_volume(tmp_path / "launcher-volume", "old")
    flags = ["--stand-in", "--mock-gpus", "1", "--auth-token-file", str(tmp_path / "launcher-volume" / "token"),
             "--auth-token-grace-seconds", "3"]  # fmt: skip
    block = AddressBlock.claim()
    try:
        process = LauncherProcess(tmp_path / "launcher", flags, host=str(block.allocate()), port=LAUNCHER_PORT)
        process.start()
        yield process
        assert process.stop() == []
    finally:
        block.release_block()


async def status_with(launcher: LauncherProcess, token: str) -> int:
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{launcher.url}/v2/vllm/instances", headers=headers) as r,
    ):
        return r.status


async def test_a_running_launcher_follows_its_rotated_secret(launcher: LauncherProcess, tmp_path: Path) -> None:
    assert await status_with(launcher, "old") == 200
    assert await status_with(launcher, "new") == 401
    write_secret_volume(tmp_path / "launcher-volume", "new")
    assert await status_with(launcher, "new") == 200, "the new token works at once, without a restart"
    assert await status_with(launcher, "old") == 200, "controllers not yet updated still get through"
    await asyncio.sleep(3.2)
    assert await status_with(launcher, "old") == 401, "the replaced token expires after its grace period"
    assert await status_with(launcher, "new") == 200


async def test_the_controllers_client_follows_its_rotated_secret_before_or_after_the_launcher(
    launcher: LauncherProcess, tmp_path: Path
) -> None:
    controller_volume = tmp_path / "controller-volume"
    write_secret_volume(controller_volume, "old")
    async with aiohttp.ClientSession() as session:
        client = LauncherClient(HttpCaller(session, None, "ns"), TokenFile(controller_volume / "token"))

        async def listing() -> None:
            assert (await client.list_instances(launcher.host)).total_instances == 0

        await listing()
        # The controller's kubelet is first: the launcher still knows only the old token; the client, refused,
        # sends the token it replaced.
        write_secret_volume(controller_volume, "new")
        await listing()
        assert client.headers == {"Authorization": "Bearer new"}
        # Then the launcher's: the new token is accepted as it is.
        write_secret_volume(tmp_path / "launcher-volume", "new")
        await listing()
        # A token neither side ever had is refused, and the error says 401.
        write_secret_volume(controller_volume, "wrong")
        await asyncio.sleep(
            3.2
        )  # the launcher forgets "old", the client's "new" is now its previous one: still accepted
        await listing()
        write_secret_volume(controller_volume, "wrong-again")
        with pytest.raises(HttpError) as refused:
            await listing()
        assert refused.value.reply is not None
        assert refused.value.reply.status == 401
