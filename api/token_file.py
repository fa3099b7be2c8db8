"""A bearer token kept in a file that changes under a running process: a mounted Secret.

Launchers require a token (from a Secret mounted into their Pods) and the controllers send it (from the same
Secret mounted into theirs). When the Secret changes, the kubelet swaps the volume's files atomically; a process
that read its token once would hold a stale one, and its peers would answer 401 until it restarts. `TokenFile`
looks at the file (one `stat`: device, inode, size, mtime) on every use and re-reads it when it changed.

Each kubelet updates its own Pods' volumes, so after a rotation the two ends of a call see the new token at
different moments. The token that was replaced therefore stays acceptable for `grace_seconds` after this
process saw the change: a launcher accepts it from controllers that have not seen the new one yet, and a
controller sends it again to a launcher that answered the new one with 401.

A file that becomes empty or unreadable keeps the last token (a half-made Secret must not switch
authentication off); a file that never had one yields `fallback` (a Secret the controller just created, before
the kubelet has filled the volume), else "".
"""

import hmac
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

DEFAULT_GRACE_SECONDS: Final = 300.0
_Stamp = tuple[int, int, int, int]


class TokenFile:
    def __init__(
        self,
        path: Path,
        fallback: str = "",
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self._token = fallback
        self._stamp: _Stamp | None = None
        self._previous = ""
        self._replaced_at = 0.0
        self._grace = grace_seconds
        self._clock = clock
        self._refresh()

    def _refresh(self) -> None:
        try:
            info = os.stat(self.path)
        except OSError:
            return
        stamp = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            token = self.path.read_text().strip()
        except OSError as error:
            log.warning("cannot read the token file %s (%s); keeping the token read before", self.path, error)
            return
        if not token:
            log.warning("the token file %s is empty; keeping the token read before", self.path)
            return
        if token != self._token:
            if self._token:
                log.info("the token in %s changed; the one before stays valid for %.0f s", self.path, self._grace)
            self._previous, self._token, self._replaced_at = self._token, token, self._clock()

    def current(self) -> str:
        """The token as the file holds it now ("" when there never was one)."""
        self._refresh()
        return self._token

    def previous(self) -> str | None:
        """The token the current one replaced, while it is within its grace period."""
        self._refresh()
        if self._previous and self._clock() - self._replaced_at < self._grace:
            return self._previous
        return None

    def accepts(self, presented: str) -> bool:
        """Whether `presented` (the token, without "Bearer ") is the current token or, in its grace period,
        the previous one; compared in constant time, and never when there is no token at all."""
        candidates = [token for token in (self.current(), self.previous()) if token]
        return any(hmac.compare_digest(presented.encode(), token.encode()) for token in candidates)
