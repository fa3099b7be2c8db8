"""Where an instance's start-up time goes, and how many bytes its sleeps and wakes move per second.

The instance marks the moments that end each start-up phase (and each sleep and wake, with the bytes
the runtime says it moved) in a `marks` file in its work directory, one JSON line per mark with the
system-wide monotonic clock, which the launcher's own clock reads too. Marks come from the instance's
own log records: in the forked child (`record_marks`) every record any logger emits, whatever its
handlers, is matched against the runtime's `Marker`s (vLLM's "Loading weights took …", uvicorn's
"Application startup complete", …) before it is handled. A process the server forks inherits the hook
(vLLM's engine core on a CPU, and on a GPU where vLLM forks it); one vLLM spawns does not, and the
phases it would have marked are then folded into the next phase that was marked.

A phase lasts from the previous mark to its own: `fork` from the create to the child's first line of
code, `engine_config` to the engine's configuration, `weights_load`, `kv_cache_profiling`, `warmup`
(model warm-up, CUDA graph capture), `api_listening` to the HTTP server accepting, `first_healthy` to
the launcher's first 200 from /health. A runtime that marks no weights load (the stand-in) has no such
phase; its time is in the next one.
"""

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

MARKS_FILE = "marks"  # in the instance's work directory

FORKED, CONFIGURED, WEIGHTS_LOADED, KV_CACHE_PROFILED, WARMED_UP, LISTENING = (
    "forked", "configured", "weights_loaded", "kv_cache_profiled", "warmed_up", "listening",
)  # fmt: skip
SLEPT, WOKE = "slept", "woke"
# Each phase and the mark that ends it, in order; `first_healthy` ends at the launcher's first 200 (no mark).
PHASES: tuple[tuple[str, str | None], ...] = (
    ("fork", FORKED),
    ("engine_config", CONFIGURED),
    ("weights_load", WEIGHTS_LOADED),
    ("kv_cache_profiling", KV_CACHE_PROFILED),
    ("warmup", WARMED_UP),
    ("api_listening", LISTENING),
    ("first_healthy", None),
)
PHASE_NAMES = tuple(name for name, _ in PHASES)
_ONCE = frozenset(mark for _, mark in PHASES if mark is not None)
_UNIT_BYTES = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


@dataclass(frozen=True)
class Marker:
    """A log message that marks `mark`; for sleeps and wakes its `size` and `unit` groups give the bytes moved."""

    mark: str
    pattern: re.Pattern[str]

    def bytes_in(self, found: re.Match[str]) -> int | None:
        groups = found.groupdict()
        if groups.get("size") is None:
            return None
        return int(float(groups["size"]) * _UNIT_BYTES[groups.get("unit") or "B"])


def marker(mark: str, pattern: str) -> Marker:
    return Marker(mark, re.compile(pattern))


@dataclass(frozen=True)
class Mark:
    name: str
    at: float  # time.monotonic()
    bytes: int | None = None


class _MarkWriter:
    """Appends marks to the file; the descriptor is a plain file, so it survives the instance's fd clean-up."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)

    def write(self, name: str, size: int | None = None) -> None:
        line = json.dumps({"mark": name, "at": time.monotonic(), "bytes": size}) + "\n"
        os.write(self._fd, line.encode())  # one write per line: lines of forked processes never interleave


def record_marks(path: Path, markers: tuple[Marker, ...]) -> None:
    """In the forked child: mark `forked` now, then every marker the process's log records match."""
    writer = _MarkWriter(path)
    writer.write(FORKED)
    seen: set[str] = set()
    original = logging.Logger.callHandlers

    def call_handlers(logger: logging.Logger, record: logging.LogRecord) -> None:
        if record.levelno >= logging.INFO:
            try:
                message = record.getMessage()
            except (TypeError, ValueError):
                message = str(record.msg)
            for each in markers:
                found = each.pattern.search(message)
                if found is not None and not (each.mark in _ONCE and each.mark in seen):
                    seen.add(each.mark)
                    writer.write(each.mark, each.bytes_in(found))
        original(logger, record)

    logging.Logger.callHandlers = call_handlers  # type: ignore[method-assign,assignment]


def read_marks(path: Path) -> list[Mark]:
    """The marks so far; a line cut short by a write in progress is left for the next read."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    marks = []
    for line in text.splitlines():
        try:
            raw = json.loads(line)
            marks.append(Mark(str(raw["mark"]), float(raw["at"]), None if raw["bytes"] is None else int(raw["bytes"])))
        except (ValueError, KeyError, TypeError):
            continue
    return marks


def startup_phases(created_at: float, marks: list[Mark], ready_at: float) -> dict[str, float]:
    """Seconds per phase, in order; a phase whose mark is missing (or came after a later phase's) is left
    out, its time counted in the next phase that was marked."""
    first: dict[str, float] = {}
    for each in marks:
        first.setdefault(each.name, each.at)
    phases: dict[str, float] = {}
    previous = created_at
    for name, mark in PHASES:
        end = ready_at if mark is None else first.get(mark)
        if end is None or end < previous or end > ready_at:
            continue
        phases[name] = round(end - previous, 6)
        previous = end
    return phases


def moved_bytes(marks: list[Mark], kind: str, since: float) -> int | None:
    """The bytes the latest `kind` mark at or after `since` reports, None where the runtime reported none."""
    found = [m for m in marks if m.name == kind and m.at >= since and m.bytes is not None]
    return found[-1].bytes if found else None
