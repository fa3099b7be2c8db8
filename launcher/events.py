"""The launcher's event log: a boot ID, a revision counter, a bounded history and live watchers.

Revisions count from 1 in each launcher process, which a fresh boot ID (a UUID) names; every event
carries it, so a client that sees a new one knows the revisions it holds belong to a launcher that is
gone. A watcher that resumes with `since=N` gets every event after revision N, or `Gone` when some of
those events have already left the history, or when N is not a revision this process has reached
(a negative one, or one ahead of it: the client's launcher restarted), so it knows it must re-list,
as Kubernetes watches do.
"""

import asyncio
import collections
import uuid

from api.launcher import EventType, InstanceState, WatchEvent

from .errors import Gone

HISTORY_SIZE = 1000

_Queue = asyncio.Queue[WatchEvent | None]


def _end_stream(queue: _Queue) -> None:
    if queue.full():
        queue.get_nowait()
    queue.put_nowait(None)


class Subscription:
    """One watcher's events: its initial ones, then live ones, until it falls a whole history behind or
    the log closes. Subscribed when made, so a caller that takes the initial events and subscribes
    without awaiting in between misses no event."""

    def __init__(self, log: "EventLog", queue: _Queue, initial: list[WatchEvent]) -> None:
        self._log = log
        self._queue = queue
        self._pending = collections.deque(initial)

    async def next(self, idle_timeout: float | None) -> WatchEvent | None:
        """The next event; None once the stream has ended; TimeoutError when none came in `idle_timeout`
        seconds (the caller sends a heartbeat and asks again: no event is lost), if it is not None."""
        if self._pending:
            return self._pending.popleft()
        # asyncio.timeout, not wait_for: no task per wait (a launcher's heartbeats on every stream), and a
        # stream cancelled as an event arrives stays cancelled (Python 3.11's wait_for can lose that).
        async with asyncio.timeout(idle_timeout):
            return await self._queue.get()

    def close(self) -> None:
        self._log.unsubscribe(self._queue)


class EventLog:
    def __init__(self, history_size: int = HISTORY_SIZE) -> None:
        if history_size < 1:
            raise ValueError(f"the watch history must keep at least one event, not {history_size}")
        self.boot_id = str(uuid.uuid4())
        self.revision = 0
        self._history: collections.deque[WatchEvent] = collections.deque(maxlen=history_size)
        self._watchers: set[_Queue] = set()
        self._history_size = history_size

    def next_revision(self) -> int:
        self.revision += 1
        return self.revision

    def event(self, type_: EventType, state: InstanceState, exit_code: int | None = None) -> WatchEvent:
        """An event of this launcher (its boot ID on it), published or not."""
        return WatchEvent(type=type_, object=state, exit_code=exit_code, boot_id=self.boot_id)

    def publish(self, type_: EventType, state: InstanceState, exit_code: int | None = None) -> None:
        """Record an event whose object already carries the revision from `next_revision`."""
        event = self.event(type_, state, exit_code)
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
        """Events after revision `since`; `Gone` if the history no longer holds all of them, or if
        `since` is not a revision of this launcher process (negative, or ahead of the current one)."""
        if since < 0:
            raise Gone(f"revision {since} is not a revision (they count from 0); list again")
        if since > self.revision:
            raise Gone(
                f"revision {since} is ahead of this launcher's current revision {self.revision}: the launcher "
                f"restarted (boot ID {self.boot_id}); list again"
            )
        if since == self.revision:
            return []
        oldest = self._history[0].object.revision
        if oldest > since + 1:
            raise Gone(f"revision {since} is too old: the oldest event kept has revision {oldest}; list again")
        return [event for event in self._history if event.object.revision > since]

    def subscribe(self, initial: list[WatchEvent]) -> Subscription:
        queue: _Queue = asyncio.Queue(maxsize=self._history_size)
        self._watchers.add(queue)
        return Subscription(self, queue, initial)

    def unsubscribe(self, queue: _Queue) -> None:
        self._watchers.discard(queue)

    def close_all(self) -> None:
        for queue in self._watchers:
            _end_stream(queue)
        self._watchers.clear()
