"""JSON log lines on stderr that carry the requester's name (E10), so a log pipeline can join them to the Pod.

Fields passed with `extra=` become fields of the line. Stdout is left to the relayed log (set-log).
"""

import datetime
import json
import logging
import sys

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def __init__(self, requester: str) -> None:
        super().__init__()
        self._requester = requester

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "requester": self._requester,
            "msg": record.getMessage(),
        }
        entry.update({key: value for key, value in vars(record).items() if key not in _STANDARD})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(level: str, requester: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(requester))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
