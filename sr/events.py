"""Structured events: one log record per event, plus in-process listeners.

The pool and the router describe what happens as named events (`replica_ready`,
`replica_ejected`, ...). An `EventSink` logs each on `sr.events` and hands it to listeners,
which is how metrics are fed without the pool knowing about Prometheus.

Every event record carries its structured line (`{"ts", "event", **fields}`) as the record
attribute named by LINE_ATTR, so a log formatter (sr.logs) renders it as JSON or as
text without parsing anything; the record's message is that line as JSON, for readers that
only see messages (pytest's caplog).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

Listener = Callable[[str, dict[str, Any]], None]

# The LogRecord attribute holding a record's structured line (a dict with at least "ts").
LINE_ATTR = "sr_line"
# Set (True) on a record relayed from a worker's stderr (sr.pool.worker_log).
WORKER_ATTR = "sr_worker"

_log = logging.getLogger("sr.events")


class EventSink:
    def __init__(self, *, log: bool = True):
        self._listeners: list[Listener] = []
        self._log = log

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def emit(self, event: str, **fields: Any) -> None:
        if self._log and _log.isEnabledFor(logging.INFO):
            line = {"ts": round(time.time(), 3), "event": event, **fields}
            message = json.dumps(line, default=str, separators=(",", ":"))
            _log.info(message, extra={LINE_ATTR: line})
        for listener in self._listeners:
            listener(event, fields)


class RecordingSink(EventSink):
    """An EventSink that keeps every event; for tests."""

    def __init__(self) -> None:
        super().__init__(log=False)
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.subscribe(lambda event, fields: self.events.append((event, fields)))

    def named(self, event: str) -> list[dict[str, Any]]:
        return [fields for name, fields in self.events if name == event]
