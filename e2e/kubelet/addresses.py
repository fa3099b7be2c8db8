"""Loopback addresses for Nodes and Pods: each Node owns a 127.N.0.0/16 block, its Pods get addresses in it.

Blocks are claimed with an exclusive `flock` on a file under a machine-wide directory, so two loopback
clusters on one machine (say `make cluster-up` and a test session) never hand out the same address.
There are 223 blocks for the whole machine, so a cluster of many simulated Nodes gives each Node a
127.N.K.0/24 of a claimed block instead (`SubnetCarver`): 256 Nodes per block, 253 Pod addresses each.
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


def _claim_octet(lock_dir: Path) -> tuple[int, int]:
    """The second octet of a free 127.N.0.0/16 and the descriptor holding its flock."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    for octet in range(_FIRST_BLOCK, _LAST_BLOCK + 1):
        fd = os.open(lock_dir / f"127.{octet}.lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return octet, fd
    raise AddressesExhaustedError(f"all loopback blocks under {lock_dir} are claimed")


class AddressBlock:
    """A Node's addresses: the network's first host is the Node's own address, Pods get the rest. A
    block claimed for one Node is a whole 127.N.0.0/16 (it holds the flock); a carved one is a subnet
    of a block its `SubnetCarver` holds."""

    def __init__(self, network: ipaddress.IPv4Network, lock_fd: int | None = None) -> None:
        self.network = network
        self.host_ip = require_loopback(self.network.network_address + 1)
        self._lock_fd = lock_fd
        self._in_use: set[ipaddress.IPv4Address] = set()
        self._next = int(self.host_ip) + 1

    @classmethod
    def claim(cls, lock_dir: Path = DEFAULT_LOCK_DIR) -> "AddressBlock":
        octet, fd = _claim_octet(lock_dir)
        return cls(ipaddress.IPv4Network(f"127.{octet}.0.0/16"), fd)

    def release_block(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing drops the flock
            self._lock_fd = None

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


class SubnetCarver:
    """Hands out one 127.N.K.0/24 per Node from blocks it claims as it needs them, for clusters with
    more Nodes than a machine has blocks (simulated ones: hundreds of Nodes, a few Pods each)."""

    PREFIX = 24
    BLOCK_SUBNETS = 2 ** (PREFIX - 16)

    def __init__(self, lock_dir: Path = DEFAULT_LOCK_DIR) -> None:
        self._lock_dir = lock_dir
        self._locks: list[int] = []
        self._free: list[ipaddress.IPv4Network] = []

    def carve(self) -> AddressBlock:
        if not self._free:
            octet, fd = _claim_octet(self._lock_dir)
            self._locks.append(fd)
            self._free = list(ipaddress.IPv4Network(f"127.{octet}.0.0/16").subnets(new_prefix=self.PREFIX))
        return AddressBlock(self._free.pop(0))

    def release_blocks(self) -> None:
        for fd in self._locks:
            os.close(fd)
        self._locks.clear()
        self._free.clear()
