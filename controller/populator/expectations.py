"""Pending expectations: launcher creations and deletions made but not yet seen in the informer cache.

Right after creating a launcher the cache does not have it yet; acting on that cache would create it
again. So each create and delete is remembered by the Pod's UID until the cache shows it, and a key
with pending expectations waits. If the cache never catches up (a watch event was lost, or someone
else deleted the Pod at once), the expectations time out and the caller lists from the API server and
resets them.
"""

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from enum import Enum


class Expectations(Enum):
    SATISFIED = "satisfied"
    """Nothing pending: the cache can be trusted."""
    WAITING = "waiting"
    """Something pending and still within the timeout: look again later."""
    TIMED_OUT = "timed out"
    """Something pending for too long: list from the API server and reset."""


@dataclass
class _Pending:
    creations: set[str] = field(default_factory=set)
    deletions: set[str] = field(default_factory=set)
    deadline: float = 0.0


class PendingExpectations:
    """Per key, the UIDs of launchers created or deleted but not yet seen so in the cache."""

    def __init__(self, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._timeout = timeout
        self._clock = clock
        self._pending: dict[Hashable, _Pending] = {}

    def expect_creation(self, key: Hashable, uid: str) -> None:
        self._expect(key).creations.add(uid)

    def expect_deletion(self, key: Hashable, uid: str) -> None:
        self._expect(key).deletions.add(uid)

    def _expect(self, key: Hashable) -> _Pending:
        pending = self._pending.setdefault(key, _Pending())
        pending.deadline = self._clock() + self._timeout
        return pending

    def observe_creation(self, key: Hashable, uid: str) -> None:
        """The cache shows the Pod `uid`; unexpected UIDs are ignored."""
        if (pending := self._pending.get(key)) is not None:
            pending.creations.discard(uid)
            self._drop_if_done(key, pending)

    def observe_deletion(self, key: Hashable, uid: str) -> None:
        """The cache shows the Pod `uid` deleting or gone; unexpected UIDs are ignored."""
        if (pending := self._pending.get(key)) is not None:
            pending.deletions.discard(uid)
            self._drop_if_done(key, pending)

    def _drop_if_done(self, key: Hashable, pending: _Pending) -> None:
        if not pending.creations and not pending.deletions:
            del self._pending[key]

    def check(self, key: Hashable) -> Expectations:
        pending = self._pending.get(key)
        if pending is None:
            return Expectations.SATISFIED
        return Expectations.WAITING if self._clock() < pending.deadline else Expectations.TIMED_OUT

    def remaining(self, key: Hashable) -> float:
        """Seconds until the key's expectations time out (0 when none are pending)."""
        pending = self._pending.get(key)
        return max(pending.deadline - self._clock(), 0.0) if pending is not None else 0.0

    def reset(self, key: Hashable) -> None:
        """Forget the key's expectations: the caller has fresh state from the API server."""
        self._pending.pop(key, None)
