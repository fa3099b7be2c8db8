"""The launcher's event log: a revision counter, a bounded history and live watchers.

A watcher that resumes with `since=N` gets every event after revision N, or `Gone` when some of
those events have already left the history, so it knows it must re-list (as Kubernetes watches do).
"""

import asyncio
import collections
from collections.abc import AsyncGenerator

from api.launcher import EventType, InstanceState, WatchEvent

from .errors import Gone

HISTORY_SIZE = 1000

_Queue = asyncio.Queue[WatchEvent | None]


def _end_stream(queue: _Queue) -> None:
    if queue.full():
        queue.get_nowait()
    queue.put_nowait(None)


class EventLog:
    def __init__(self, history_size: int = HISTORY_SIZE) -> None:
        self.revision = 0
        self._history: collections.deque[WatchEvent] = collections.deque(maxlen=history_size)
        self._watchers: set[_Queue] = set()
        self._history_size = history_size

    def next_revision(self) -> int:
        self.revision += 1
        return self.revision

    def publish(self, type_: EventType, state: InstanceState, exit_code: int | None = None) -> None:
        """Record an event whose object already carries the revision from `next_revision`."""
        event = WatchEvent(type=type_, object=state, exit_code=exit_code)
        self._history.append(event)
        for queue in list(self._watchers):
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:
                # This watcher is a whole history behind: end its stream so it re-lists and
                # resumes with `since`, instead of buffering without bound.
                self._watchers.discard(queue)
                _end_stream(queue)

    def replay_since(self, since: int) -> list[WatchEvent]:
        """Events after revision `since`; `Gone` if the history no longer holds all of them."""
        if since >= self.revision:
            return []
        oldest = self._history[0].object.revision if self._history else self.revision + 1
        if oldest > since + 1:
            raise Gone(f"revision {since} is too old: the oldest event kept has revision {oldest}; re-list")
        return [event for event in self._history if event.object.revision > since]

    def subscribe(self, initial: list[WatchEvent]) -> AsyncGenerator[WatchEvent]:
        """`initial`, then live events, until the watcher falls too far behind or the log closes.

        Subscribes now, not at the first iteration, so a caller that takes `initial` and calls
        this without awaiting in between misses no event.
        """
        queue: _Queue = asyncio.Queue(maxsize=self._history_size)
        self._watchers.add(queue)
        return self._stream(queue, initial)

    async def _stream(self, queue: _Queue, initial: list[WatchEvent]) -> AsyncGenerator[WatchEvent]:
        try:
            for event in initial:
                yield event
            while (live := await queue.get()) is not None:
                yield live
        finally:
            self._watchers.discard(queue)

    def close_all(self) -> None:
        for queue in self._watchers:
            _end_stream(queue)
        self._watchers.clear()
