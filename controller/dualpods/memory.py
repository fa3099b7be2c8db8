"""What the dual-pods controller keeps only in memory: losing it on restart costs at most a metric label, a
re-sent readiness, one question to a provider whether it sleeps, a phase change logged again, (within a
moment of a launcher's creation) the wait for the watch to show it, or a pass made on a cache that does not
show the controller's last write yet. Nothing about what a requester's status shows lives here: that is read
from the requester itself (status.py).

The last: a pass that read a Pod from a cache older than this controller's own write of it would decide
again what that write decided (ask a requester for its GPUs again, write the same annotations again, or
fail with a conflict), so it waits for the write's watch event instead (reconcile.py). Which copy is older
is told by comparing resourceVersions, as integers (KEP-5504, GA in Kubernetes 1.35); a version that is
not one is never taken as older.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from controller import pods
from controller.dualpods.pools.filling import Filling

SWEEP_S = 10.0  # the least time between two sweeps of gone Pods' memory


class Relayed(NamedTuple):
    """A readiness relayed to a requester: what, to which run of its container, and when (monotonic)."""

    ready: bool
    restart_count: int
    at: float


class Trouble(NamedTuple):
    """A wait or transient failure standing in a requester's phase: since when (monotonic), after how many
    failed passes; its phase's time budget says when the user is told."""

    phase: StrEnum
    since: float
    failures: int


@dataclass
class Memory:
    paths: dict[str, str] = field(default_factory=dict)  # requester UID -> cold / warm / hot
    victims: dict[str, int] = field(default_factory=dict)  # requester UID -> instances deleted for it
    relayed: dict[str, Relayed] = field(default_factory=dict)  # requester UID -> its readiness last relayed
    actuated: set[str] = field(default_factory=set)  # requester UIDs whose actuation was measured
    # requester UID -> (its container's restart count, the server its proxy was pointed at)
    proxied: dict[str, tuple[int, tuple[str, int]]] = field(default_factory=dict)
    # Direct provider UID -> (its container's restart count, asleep) as last seen or made: a restarted
    # container starts awake, so the knowledge holds only for the same count.
    asleep: dict[str, tuple[int, bool]] = field(default_factory=dict)
    phases: dict[str, str] = field(default_factory=dict)  # requester name -> the phase its last pass ran
    # requester UID -> what stands in its phase: a restart starts a phase's budget afresh (reconcile.py)
    troubles: dict[str, Trouble] = field(default_factory=dict)
    # requester UID -> (the launcher created for it, when (monotonic)): until the Pod cache shows that launcher,
    # a pass that still finds the requester unbound must not create another (binding.py)
    launching: dict[str, tuple[str, float]] = field(default_factory=dict)
    written: dict[str, int] = field(default_factory=dict)  # Pod UID -> the resourceVersion of its last write
    swept_at: float = float("-inf")  # when (monotonic) forget_gone last swept
    pools: dict[str, Filling] = field(default_factory=dict)  # ISC name -> its warm pool as its keeper last found it

    def wrote(self, pod: pods.Pod, version: str) -> None:
        if (number := _version(version)) is not None:
            self.written[pods.uid(pod)] = number

    def behind(self, pod: pods.Pod | None) -> bool:
        """Whether `pod`, as cached, is older than this controller's last write of it."""
        if pod is None or (written := self.written.get(pods.uid(pod))) is None:
            return False
        cached = _version(pods.meta(pod).get("resourceVersion", ""))
        if cached is not None and cached < written:
            return True
        del self.written[pods.uid(pod)]
        return False

    def forget_gone(self, live_uids: Callable[[], set[str]]) -> None:
        """Forget the Pods not among `live_uids()` (FMA drops an inference server's state once both Pods are
        gone), at most once every SWEEP_S: a sweep reads every cached Pod, and a swap wave ends thousands of
        pairs. What a gone Pod leaves meanwhile is keyed by its UID, which no other Pod will have."""
        if time.monotonic() - self.swept_at < SWEEP_S:
            return
        self.swept_at = time.monotonic()
        uids = live_uids()
        tables: list[dict[str, Any]] = [
            self.paths,
            self.victims,
            self.relayed,
            self.proxied,
            self.asleep,
            self.troubles,
            self.launching,
            self.written,
        ]
        for table in tables:
            for uid in [u for u in table if u not in uids]:
                del table[uid]
        self.actuated &= uids


def _version(text: str) -> int | None:
    """A resourceVersion as the integer it is on Kubernetes 1.35+ (no sign, no leading zero), else None."""
    return int(text) if text.isascii() and text.isdigit() and not text.startswith("0") else None
