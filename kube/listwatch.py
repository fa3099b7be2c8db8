"""The one list → watch → back-off loop behind every cache the controllers keep.

Both the informers (the API server's objects) and the launcher views (what each launcher holds) are fed
the same way, client-go's reflector: list in full, then follow the change stream from where the list
left off. A stream that ends or breaks is resumed from the last change seen (cheap, nothing is missed);
a resume point the server no longer holds — 410 Gone, "resourceVersion too old", a launcher that
restarted (a new boot ID), a stream silent past its heartbeat — means listing again. Failures back off
exponentially with jitter (`kube.backoff`), and a caller can cut a back-off short (`Feed.nudge`)
when it learns the other side is back, so a cache catches up within moments of its server returning.

Streams are NDJSON read line by line, each line of any size up to `MAX_LINE_BYTES` (aiohttp's own line
reader stops at 512 KiB; the API server's objects reach 1.5 MiB), with a read timeout so that a
half-open connection is noticed.
"""

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Protocol

import aiohttp
from aiohttp.http_exceptions import LineTooLong

from kube.backoff import Backoff

log = logging.getLogger(__name__)

QUIET_FAILURES = 10  # failures in a row logged at debug level (a server still starting), then at info
# A stream line longer than this is taken for a broken stream (the feed lists again); every object the
# API server or a launcher can send is far smaller.
MAX_LINE_BYTES = 64 * 1024 * 1024


class Expired(Exception):
    """The resume point is gone (410, a new launcher epoch, a silent stream): list again."""


class Feed(Protocol):
    """One cache's source: `list` replaces the cache in full, `watch` applies changes from where the last
    list or change left off until its stream ends (return) or breaks (raise)."""

    name: str

    async def list(self) -> None: ...

    async def watch(self) -> None: ...


async def list_and_watch(feed: Feed, backoff: Backoff | None = None) -> None:
    """Keep `feed`'s cache current until cancelled."""
    backoff = backoff or Backoff()
    listed = False
    failures = 0
    while True:
        try:
            if not listed:
                await feed.list()
                listed = True
                backoff.reset()
            failures = 0
            await feed.watch()
            backoff.reset()
        except Expired as why:
            log.debug("%s: listing again (%s)", feed.name, why)
            listed = False
        except Exception as err:  # a broken connection, a refusal: the next try decides
            failures += 1
            delay = await backoff.wait()
            level = logging.DEBUG if failures <= QUIET_FAILURES else logging.INFO
            log.log(level, "%s: %s failed %d times (%s); retried after %.1f s", feed.name,
                    "watch" if listed else "list", failures, err or type(err).__name__, delay)  # fmt: skip


async def lines(stream: aiohttp.StreamReader, silence_s: float | None) -> AsyncIterator[bytes]:
    """The stream's lines (empty lines included: they are heartbeats), until it ends. TimeoutError when
    nothing at all arrives for `silence_s`; ValueError for a line over MAX_LINE_BYTES."""
    while True:
        async with asyncio.timeout(silence_s):
            try:
                line = await stream.readuntil(b"\n", max_size=MAX_LINE_BYTES)
            except LineTooLong as err:
                raise ValueError(f"a stream line is longer than {MAX_LINE_BYTES} bytes") from err
        if not line:
            return
        yield line
