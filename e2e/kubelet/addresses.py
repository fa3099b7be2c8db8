"""Loopback addresses for Nodes and Pods: each Node owns a 127.N.0.0/16 block, its Pods get addresses in it.

Blocks are claimed with an exclusive `flock` on a file under a machine-wide directory, so two loopback
clusters on one machine (say `make cluster-up` and a test session) never hand out the same address.
"""

import fcntl
import ipaddress
import os
import tempfile
from pathlib import Path

LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
# 127.0.x is left alone (127.0.0.1, and 127.0.1.1 in Debian's /etc/hosts); 127.16.x holds the
# Service range (see e2e.cluster.control_plane).
_FIRST_BLOCK, _LAST_BLOCK = 32, 254
DEFAULT_LOCK_DIR = Path(tempfile.gettempdir()) / "dualpods-loopback-blocks"


class AddressesExhaustedError(RuntimeError):
    """No free block or no free Pod address is left."""


def require_loopback(address: str | ipaddress.IPv4Address) -> ipaddress.IPv4Address:
    """The network rule: every Node and Pod address is in 127.0.0.0/8, whatever happens."""
    parsed = ipaddress.IPv4Address(address)
    if parsed not in LOOPBACK:
        raise ValueError(f"{parsed} is outside 127.0.0.0/8; the loopback cluster never uses it")
    return parsed


class AddressBlock:
    """One claimed 127.N.0.0/16: the Node's own address is 127.N.0.1, Pods get the rest."""

    def __init__(self, second_octet: int, lock_fd: int) -> None:
        self.network = ipaddress.IPv4Network(f"127.{second_octet}.0.0/16")
        self.host_ip = require_loopback(self.network.network_address + 1)
        self._lock_fd = lock_fd
        self._in_use: set[ipaddress.IPv4Address] = set()
        self._next = int(self.host_ip) + 1

    @classmethod
    def claim(cls, lock_dir: Path = DEFAULT_LOCK_DIR) -> "AddressBlock":
        lock_dir.mkdir(parents=True, exist_ok=True)
        for octet in range(_FIRST_BLOCK, _LAST_BLOCK + 1):
            fd = os.open(lock_dir / f"127.{octet}.lock", os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return cls(octet, fd)
        raise AddressesExhaustedError(f"all loopback blocks under {lock_dir} are claimed")

    def release_block(self) -> None:
        os.close(self._lock_fd)  # closing drops the flock

    def allocate(self) -> ipaddress.IPv4Address:
        """The next free address, round-robin so that a released address is not reused at once."""
        first = int(self.network.network_address) + 2
        last = int(self.network.broadcast_address) - 1
        for _ in range(last - first + 1):
            candidate = ipaddress.IPv4Address(self._next)
            self._next = first if self._next >= last else self._next + 1
            if candidate not in self._in_use:
                self._in_use.add(candidate)
                return require_loopback(candidate)
        raise AddressesExhaustedError(f"no free Pod address left in {self.network}")

    def release(self, address: ipaddress.IPv4Address) -> None:
        self._in_use.discard(address)
