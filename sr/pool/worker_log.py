"""A managed worker's stderr, relayed line by line into this process's log, and its exit
described in words.

Rules:
* The router starts its workers with `--log-format json`: their stderr is a machine
  channel. Each JSON line is logged again on `sr.worker` carrying that same line, so the
  router's one log format (text or json, sr.logs) applies to worker lines too.
* A worker stamps its own deployment, replica and pid; the router only fills in what a
  line lacks. A line that is not a JSON object (a crash's traceback, a library writing to
  stderr) becomes a `warning` message of logger `sr.worker.stderr`, stamped the same way.
* The last line's message is kept for the exit reason (`describe_exit`): the `message` of
  a log line, an event's name with its reason or error, or the raw text - never raw JSON.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from collections.abc import Callable
from typing import Any

from sr.events import LINE_ATTR, WORKER_ATTR
from sr.logs import plain_line

# A line longer than this is relayed in pieces instead of buffering without bound.
MAX_LINE_BYTES = 65536
MAX_REASON_CHARS = 300

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}


class WorkerLogRelay:
    """Feed it the worker's stderr bytes; it logs one record per line."""

    def __init__(
        self,
        *,
        deployment: str,
        replica: str,
        pid: int,
        logger: logging.Logger | None = None,
        on_state: Callable[[], None] | None = None,
    ):
        """`on_state` is called for each line saying the worker listens or changed state:
        its runner probes it then, instead of at its next turn."""
        self._stamp = {"deployment": deployment, "replica": replica, "pid": pid}
        self._logger = logger or logging.getLogger("sr.worker")
        self._on_state = on_state
        self._partial = b""
        self.last_message = ""

    def feed(self, chunk: bytes) -> None:
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for raw in lines:
            self._relay(raw)
        while len(self._partial) > MAX_LINE_BYTES:
            self._relay(self._partial[:MAX_LINE_BYTES])
            self._partial = self._partial[MAX_LINE_BYTES:]

    def close(self) -> None:
        """The stream ended: relay an unterminated last line."""
        if self._partial:
            self._relay(self._partial)
            self._partial = b""

    def _relay(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        if not text.strip():
            return
        line = _json_line(text)
        if line is None:
            line = plain_line(time.time(), "warning", "sr.worker.stderr", text)
        if self._on_state is not None and line.get("event") in _STATE_EVENTS:
            self._on_state()
        for key, value in self._stamp.items():
            line.setdefault(key, value)
        self.last_message = message_of(line)[:MAX_REASON_CHARS]
        level = _LEVELS.get(str(line.get("level", "info")).lower(), logging.INFO)
        if self._logger.isEnabledFor(level):
            self._logger.log(level, "%s", text, extra={LINE_ATTR: line, WORKER_ATTR: True})


_STATE_EVENTS = frozenset({"worker_listening", "worker_state"})  # sr.worker.cli, .service


def _json_line(text: str) -> dict[str, Any] | None:
    if not text.startswith("{"):
        return None
    try:
        line = json.loads(text)
    except ValueError:
        return None
    return line if isinstance(line, dict) and "ts" in line else None


def message_of(line: dict[str, Any]) -> str:
    """What a log line says, in words."""
    if line.get("message"):
        return " ".join(str(line["message"]).split())
    event = str(line.get("event", "log"))
    detail = line.get("reason") or line.get("error")
    return f"{event}: {' '.join(str(detail).split())}" if detail else event


def describe_exit(returncode: int | None, last_message: str = "") -> str:
    """`killed by SIGKILL`, `exited 1: <last message>`, `exited 0`."""
    if returncode is None:
        return "exited"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    if returncode and last_message:
        return f"exited {returncode}: {last_message}"
    return f"exited {returncode}"
