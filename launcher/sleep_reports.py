"""An instance's server tells the launcher whether it sleeps, after a sleep or wake asked of it directly (vLLM's own
/sleep and /wake_up, which FMA's controllers use) and before it answers that request.

So a client that sleeps a server and then reads the launcher finds the sleep recorded already: the launcher's reads
never ask the server themselves (a read changes nothing and waits for nothing). The report is a datagram on a Unix
socket in the abstract namespace (no file to clean up; the launcher and its instances share their network
namespace); the kernel attaches the sender's PID (SCM_CREDENTIALS), so a report names the instance whose server sent
it and no other process can speak for an instance. Each report is read by the launcher's event loop as soon as it
comes, before any request that follows it: the reader records it at once (`Monitor.reported`).

A report that is lost (a full socket buffer) is made good by the instance's sleep-state watch, which asks the server
every liveness interval.
"""

import asyncio
import contextlib
import os
import secrets
import socket
import struct
from collections.abc import Callable

ASLEEP, AWAKE = b"asleep", b"awake"
_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid

Report = Callable[[bool], None]  # in the instance's server: whether it sleeps now


class SleepReports:
    """The launcher's end: one socket for every instance's reports."""

    def __init__(self) -> None:
        self.address = f"\0dualpods-sleep-reports-{os.getpid()}-{secrets.token_hex(8)}"
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self._socket.bind(self.address)
        self._socket.setblocking(False)
        self._loop: asyncio.AbstractEventLoop | None = None  # the one reading, once started

    def start(self, on_report: Callable[[int, bool], None]) -> None:
        """From now on, call `on_report(pid of the sender, whether it sleeps)` for each report, on the event loop."""
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._socket.fileno(), self._read, on_report)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._socket.fileno())
        self._socket.close()

    def _read(self, on_report: Callable[[int, bool], None]) -> None:
        while True:
            try:
                message, ancillary, _, _ = self._socket.recvmsg(16, socket.CMSG_SPACE(_CREDENTIALS.size))
            except BlockingIOError:
                return
            pid = next(
                (_CREDENTIALS.unpack(data)[0] for level, kind, data in ancillary
                 if (level, kind) == (socket.SOL_SOCKET, socket.SCM_CREDENTIALS)),
                None,
            )  # fmt: skip
            if pid is not None and message in (ASLEEP, AWAKE):
                on_report(pid, message == ASLEEP)


def reporter(address: str) -> Report:
    """In the instance's server: what tells the launcher at `address` whether the server sleeps now. It never blocks
    and never fails the request it reports on."""
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

    def report(sleeping: bool) -> None:
        # Where the launcher is gone, or behind, its sleep-state watch finds what this said.
        with contextlib.suppress(OSError):
            sender.sendto(ASLEEP if sleeping else AWAKE, socket.MSG_DONTWAIT, address)

    return report
