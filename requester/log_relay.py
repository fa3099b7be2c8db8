"""FMA's set-log: a log that arrives in chunks at byte offsets, possibly repeated; only new bytes are written.

A sender that retries or resends an overlapping range never duplicates output, and one that skips
ahead is refused, so the relayed log is exactly the sender's log.
"""

import asyncio
from typing import BinaryIO


class StartPositionError(ValueError):
    """`startPos` is negative or beyond what was accepted so far (a 400)."""


class LogRelay:
    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._length = 0
        self._lock = asyncio.Lock()

    async def add(self, start: int, chunk: bytes) -> str:
        """Write the part of `chunk` (which begins at byte `start`) not written yet; say what happened.

        Raises StartPositionError for a bad `start` and OSError when the output cannot be written.
        """
        async with self._lock:
            if start < 0:
                raise StartPositionError(f"Starting position {start} is unacceptable because it is negative")
            if start > self._length:
                raise StartPositionError(
                    f"Starting position {start} is beyond the current contentLength={self._length}"
                )
            news = chunk[self._length - start :]
            if not news:
                return (
                    f"Accepted startPos={start}, chunkLength={len(chunk)}, but that has nothing new; "
                    f"still contentLength={self._length}"
                )
            await asyncio.to_thread(self._write, news)
            self._length += len(news)
            return (
                f"Accepted startPos={start}, chunkLength={len(chunk)}; addedContentLength={len(news)}, "
                f"new contentLength={self._length}"
            )

    def _write(self, data: bytes) -> None:
        self._out.write(data)
        self._out.flush()
