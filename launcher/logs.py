"""Byte ranges of an instance's log file, with the launcher API's Range rules.

`bytes=S-E` (inclusive, clamped to the end of the file) and `bytes=S-` (at most one page) are
accepted; suffix ranges, multiple ranges and E < S are malformed; S beyond the end is unsatisfiable.
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import BadRequest, RangeNotSatisfiable

PAGE_BYTES = 1024 * 1024
_RANGE = re.compile(r"^bytes=(\d+)-(\d+)?$")


@dataclass(frozen=True)
class ByteRange:
    start: int
    end: int  # inclusive
    total: int

    @property
    def length(self) -> int:
        return self.end - self.start + 1

    @property
    def content_range(self) -> str:
        return f"bytes {self.start}-{self.end}/{self.total}"


def resolve_range(header: str, total: int) -> ByteRange:
    match = _RANGE.match(header.strip())
    if match is None:
        raise BadRequest(f"malformed Range header {header!r}: expected 'bytes=START-' or 'bytes=START-END'")
    start = int(match.group(1))
    end = int(match.group(2)) if match.group(2) is not None else None
    if end is not None and end < start:
        raise BadRequest(f"malformed Range header {header!r}: the end is before the start")
    if start >= total:
        raise RangeNotSatisfiable(f"range starts at {start} but the log has {total} bytes", total)
    last = total - 1
    end = min(end, last) if end is not None else min(start + PAGE_BYTES - 1, last)
    return ByteRange(start=start, end=end, total=total)


def read_range(path: Path, byte_range: ByteRange) -> bytes:
    with path.open("rb") as log:
        log.seek(byte_range.start)
        return log.read(byte_range.length)


def log_size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0
