"""Structured logs: one JSON object per line on stderr.

`sr.events` records are already JSON (built by `EventSink.emit`) and pass through as they
are; any other record under the `sr` logger (including the HTTP server's, `sr.http`) is
wrapped into an object with an `event` of `log`, so every stderr line parses as JSON.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import TextIO


class JsonLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.name == "sr.events" and message.startswith("{") and not record.exc_info:
            return message
        line = {
            "ts": round(record.created, 3),
            "event": "log",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, separators=(",", ":"))


def configure_logging(stream: TextIO | None = None, level: int = logging.INFO) -> None:
    """Send every `sr` logger to `stream` (stderr) as JSON lines; idempotent."""
    logger = logging.getLogger("sr")
    for handler in list(logger.handlers):
        if getattr(handler, "_sr_json", False):
            logger.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonLineFormatter())
    handler._sr_json = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
