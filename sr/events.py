"""Structured events: one JSON object per line, plus in-process listeners.

The pool and the router describe what happens as named events (`replica_ready`,
`replica_ejected`, ...). An `EventSink` writes each as one JSON log line and hands it to
listeners, which is how metrics are fed without the pool knowing about Prometheus.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

Listener = Callable[[str, dict[str, Any]], None]

_log = logging.getLogger("sr.events")


class EventSink:
    def __init__(self, *, log: bool = True):
        self._listeners: list[Listener] = []
        self._log = log

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def emit(self, event: str, **fields: Any) -> None:
        if self._log and _log.isEnabledFor(logging.INFO):
            record = {"ts": round(time.time(), 3), "event": event, **fields}
            _log.info(json.dumps(record, default=str, separators=(",", ":")))
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
