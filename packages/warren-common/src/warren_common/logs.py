"""Structured logs on stderr: one JSON object a line, an event's fields at the top level.

A record's fields come from `extra={"fields": {...}}`; everything a process logs (its own
loggers and its libraries') goes through the one handler `configure` puts on the root.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        doc = {
            "ts": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
            **getattr(record, "fields", {}),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def configure(level: str = "info", quiet: Iterable[str] = ()) -> None:
    """JSON lines on stderr from `level` up; the `quiet` loggers (libraries that log every
    request or message) from warnings up only."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in quiet:
        logging.getLogger(name).setLevel(logging.WARNING)
