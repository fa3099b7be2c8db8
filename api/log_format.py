"""The log lines every dualpods component writes: `--log-format text` or `json`, with the same fields.

Each record carries `component` (launcher, controller, requester, transformers_runtime), its `level`,
and where they are known the `requester` and the launcher `instance` it is about; other fields passed
with `extra=` come along, and so do the fields of the running task's `log_context` (a controller pass sets
the requester, its phase and a pass ID there, so every line of the pass carries them, whichever module
writes it). JSON: one object per line, `{"time", "level", "component", "logger", "msg",
...fields}`, what log shippers index. Text: `TIME LEVEL component logger: msg field=value ...`, what
people read in `kubectl logs`.
"""

import argparse
import contextlib
import contextvars
import datetime
import functools
import json
import logging
import os
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Final, TextIO

LOG_FORMATS: Final = ("text", "json")
COMPONENT_FIELD, REQUESTER_FIELD, INSTANCE_FIELD = "component", "requester", "instance"
PHASE_FIELD, PASS_FIELD = "phase", "pass_id"
ISC_FIELD, LAUNCHER_FIELD = "isc", "launcher"  # the object a controller pass is about, besides a requester
_CONTEXT: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "log_context", default=types.MappingProxyType({})
)
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


def _time(record: logging.LogRecord) -> str:
    return datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds")


@functools.cache
def _every_records(factory: Callable[..., logging.LogRecord]) -> frozenset[str]:
    """The attributes every record has: LogRecord's, and those the process's record factory adds to each
    (vLLM's adds `vllm_process_name` once imported, as in the launcher), which are no record's own."""
    return frozenset(vars(factory("", 0, "", 0, "", (), None))) | _STANDARD


def fields_of(record: logging.LogRecord) -> dict[str, object]:
    """The record's own fields: the component's (set by `configure`) and those passed with `extra=`."""
    every = _every_records(logging.getLogRecordFactory())
    return {key: value for key, value in vars(record).items() if key not in every}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {"time": _time(record), "level": record.levelname, "logger": record.name,
                                    "msg": record.getMessage()}  # fmt: skip
        entry.update(fields_of(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = fields_of(record)
        component = fields.pop(COMPONENT_FIELD, "")
        shown = "".join(f" {key}={value}" for key, value in fields.items())
        line = f"{_time(record)} {record.levelname} {component} {record.name}: {record.getMessage()}{shown}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


@contextlib.contextmanager
def log_context(**fields: str) -> Iterator[None]:
    """Within it, every record of this task (and of the tasks it starts) carries `fields` as well."""
    token = _CONTEXT.set({**_CONTEXT.get(), **fields})
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def context_fields() -> Mapping[str, str]:
    """The fields of the running task's `log_context`."""
    return _CONTEXT.get()


class _Fields(logging.Filter):
    """Puts the task's `log_context` fields and the component's fields on every record (a field given with
    `extra=` wins, then the context's)."""

    def __init__(self, fields: dict[str, str]) -> None:
        super().__init__()
        self._fields = fields

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in {**self._fields, **_CONTEXT.get()}.items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


def formatter(log_format: str) -> logging.Formatter:
    if log_format not in LOG_FORMATS:
        raise ValueError(f"unknown log format {log_format!r}; use one of {', '.join(LOG_FORMATS)}")
    return JsonFormatter() if log_format == "json" else TextFormatter()


def handler(log_format: str, component: str, stream: TextIO, **fields: str) -> logging.Handler:
    """A handler writing `component`'s records to `stream` in `log_format`."""
    made = logging.StreamHandler(stream)
    made.setFormatter(formatter(log_format))
    made.addFilter(_Fields({COMPONENT_FIELD: component, **fields}))
    return made


def configure(component: str, level: str, log_format: str, stream: TextIO = sys.stderr, **fields: str) -> None:
    """The root logger of a component's process: every record in `log_format`, with `component` and `fields`
    (e.g. `requester=<pod name>`)."""
    logging.basicConfig(level=level.upper(), handlers=[handler(log_format, component, stream, **fields)], force=True)


def _log_format(value: str) -> str:
    if value not in LOG_FORMATS:
        raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from {', '.join(LOG_FORMATS)})")
    return value


def add_argument(parser: argparse.ArgumentParser, default: str = "text", env: str | None = None) -> None:
    """`--log-format text|json`; `env` names a variable that sets the default (for commands that cannot add flags),
    checked as the flag is."""
    parser.add_argument(
        "--log-format",
        type=_log_format,
        default=os.environ.get(env, default) if env else default,
        help=f"log lines as text or JSON, with the same fields (default {default}" + (f"; env {env})" if env else ")"),
    )
