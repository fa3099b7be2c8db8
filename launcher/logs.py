"""Byte ranges of an instance's log file, with FMA's Range rules.

`bytes=S-E` (inclusive, clamped to the end of the file) and `bytes=S-` (at most one page) are
accepted; suffix ranges, multiple ranges and E < S are malformed (400), and that is decided before
anything else, as FMA does. No Range at all reads the first page, as `bytes=0-` does. A start at or
beyond the end, an empty log included, is unsatisfiable (416).
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path

from api.launcher import LOG_PAGE_BYTES

from .errors import BadRequest, RangeNotSatisfiable

PAGE_BYTES = LOG_PAGE_BYTES
_RANGE = re.compile(r"^bytes=(\d+)-(\d+)?$")


@dataclass(frozen=True)
class RequestedRange:
    start: int
    end: int | None  # inclusive; None: one page from start


FIRST_PAGE = RequestedRange(0, None)


@dataclass(frozen=True)
class ByteRange:
    start: int
    end: int  # inclusive
    total: int

    @property
    def length(self) -> int:
        return self.end - self.start + 1


def parse_range(header: str) -> RequestedRange:
    match = _RANGE.match(header.strip())
    if match is None:
        raise BadRequest(f"malformed Range header {header!r}: expected 'bytes=START-' or 'bytes=START-END'")
    start = int(match.group(1))
    end = int(match.group(2)) if match.group(2) is not None else None
    if end is not None and end < start:
        raise BadRequest(f"malformed Range header {header!r}: the end is before the start")
    return RequestedRange(start, end)


def resolve_range(requested: RequestedRange, total: int) -> ByteRange:
    """The bytes of a log of `total` bytes that `requested` covers; RangeNotSatisfiable if none."""
    if requested.start >= total:
        raise RangeNotSatisfiable(f"range starts at {requested.start} but the log has {total} bytes", total)
    last = total - 1
    end = min(requested.end, last) if requested.end is not None else min(requested.start + PAGE_BYTES - 1, last)
    return ByteRange(start=requested.start, end=end, total=total)


def read_range(path: Path, byte_range: ByteRange) -> bytes:
    with path.open("rb") as log:
        log.seek(byte_range.start)
        return log.read(byte_range.length)


def content_range(start: int, data: bytes, total: int) -> str:
    """The Content-Range of `data` read from `start` (its length as read, should the file have changed)."""
    return f"bytes {start}-{start + len(data) - 1}/{total}"


def log_size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0
