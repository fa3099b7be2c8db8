"""Each instance's output on the launcher's own stdout, every line prefixed with the instance's ID.

An instance's server writes its stdout and stderr to its log file (which `GET …/log` serves); the
launcher follows that file and copies every new line to its own stdout, where `kubectl logs` and log
shippers look: `<instance> | <line>` in the text log format, and in the JSON one a record with the
`instance` field and the line's own level where it names one (`INFO`, `WARNING`, …). Following the file
rather than reading a pipe means a slow launcher never blocks an instance's writes, and the file stays
the instance's complete record; the copy lags it by at most POLL_S. The copy leaves out one kind of line:
the access-log lines of the launcher's own probes of the server (`GET /health` and `GET /is_sleeping`
answered 200, every 2 s), which say nothing to someone reading the launcher's log and stay in the file.
"""

import asyncio
import contextlib
import logging
import re
import sys
from pathlib import Path

from api import log_format

from .instance import InstanceEnd

POLL_S = 0.2
READ_BYTES = 256 * 1024  # at most per read
MAX_LINE_BYTES = 16 * 1024  # a longer line is copied in pieces of this size
_LEVEL = re.compile(r"\b(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\b")
_LEVELS = {"WARN": logging.WARNING, "FATAL": logging.CRITICAL}
# An access-log line of a successful probe, in vLLM's (uvicorn's) and the stand-in's (aiohttp's) formats.
_PROBE_ACCESS = re.compile(r'"GET /(?:health|is_sleeping) HTTP/1\.[01]" 200\b')

output_log = logging.getLogger("launcher.instance_output")


class _PrefixedLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"{getattr(record, log_format.INSTANCE_FIELD, '?')} | {record.getMessage()}"


def configure(format_name: str) -> None:
    """Copied lines go to stdout in `format_name`, apart from the launcher's own records (stderr)."""
    handler = log_format.handler(format_name, "launcher", sys.stdout)
    if format_name == "text":
        handler.setFormatter(_PrefixedLines())
    output_log.handlers[:] = [handler]
    output_log.propagate = False
    output_log.setLevel(logging.DEBUG)


def level_of(line: str) -> int:
    """The level a line names near its start (vLLM's and uvicorn's lines do), else INFO."""
    found = _LEVEL.search(line[:80])
    if found is None:
        return logging.INFO
    name = found.group(1)
    return _LEVELS.get(name) or logging.getLevelNamesMapping()[name]


def _read(path: Path, offset: int) -> bytes:
    try:
        with path.open("rb") as log:
            log.seek(offset)
            return log.read(READ_BYTES)
    except FileNotFoundError:
        return b""


def _emit(instance_id: str, raw: bytes) -> None:
    line = raw.decode(errors="replace").rstrip("\r\n")
    if _PROBE_ACCESS.search(line):
        return
    output_log.log(level_of(line), "%s", line, extra={log_format.INSTANCE_FIELD: instance_id})


async def follow(path: Path, instance_id: str, end: InstanceEnd) -> None:
    """Copy the lines of `path` as they come, until the instance exited and everything it wrote is copied."""
    offset, partial = 0, b""
    while True:
        finished = end.exited  # read once more after its exit: the last lines (a traceback) come then
        chunk = await asyncio.to_thread(_read, path, offset)
        offset += len(chunk)
        partial += chunk
        *lines, partial = partial.split(b"\n")
        for line in lines:
            for start in range(0, max(len(line), 1), MAX_LINE_BYTES):
                _emit(instance_id, line[start : start + MAX_LINE_BYTES])
        while len(partial) >= MAX_LINE_BYTES:
            _emit(instance_id, partial[:MAX_LINE_BYTES])
            partial = partial[MAX_LINE_BYTES:]
        if len(chunk) == READ_BYTES:
            continue  # more is waiting
        if finished:
            if partial:
                _emit(instance_id, partial)
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(POLL_S):
                await end.wait_exited()
