"""Logs for humans and machines: one format at a time, on stderr.

Rules:
* One setting picks the format, for `sr serve` and `sr worker` alike: `--log-format
  text|json`; without the flag SR_LOG_FORMAT; without that, text when stderr is a terminal
  and json otherwise (a pipe, a file, a container's log collector).
* Every record is first one structured line (`line_of`): an event's own line (sr.events),
  a relayed worker line (sr.pool.worker_log), or a plain record wrapped as `{"ts", "event":
  "log", "level", "logger", "message"}`, plus `request_id` when the record was logged
  while a request was being answered (sr.request_id). A process's context (a worker's
  deployment,
  replica and pid) is merged in right after "event", never over a field of the line.
* A worker's last words when its parent is gone (sr.worker.parent_watch) go through the
  same formatter (`format_unlocked`), straight to fd 2 without logging's locks.
* json: that line as one compact JSON object per line.
* text: `<UTC time> <LEVEL> <source>: <what happened>`, one line per record. Only a
  traceback (or a message with line breaks of its own) continues on the following lines,
  each indented by two spaces, so every line that starts at column 0 begins a record.
  The source is `sr` for the router's events, `worker DEPLOYMENT/REPLICA[PID]` for a
  worker's lines, the logger's name otherwise.
* AccessLog: one line per request on `sr.access`, off unless asked for (`sr serve
  --access-log`); `record` costs one attribute check while off.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

from sr.errors import UsageError
from sr.events import LINE_ATTR, WORKER_ATTR
from sr.request_id import current as current_request_id

LOG_FORMATS = ("text", "json")
LOG_FORMAT_ENV = "SR_LOG_FORMAT"

# Keys a text line shows in its prefix rather than among the event's fields.
_PREFIX_KEYS = frozenset({"ts", "event", "level", "logger", "exception"})
_WORKER_KEYS = frozenset({"deployment", "replica", "pid"})


def resolve_log_format(flag: str | None, env: Mapping[str, str], stream: TextIO) -> str:
    """The log format: the flag, else SR_LOG_FORMAT, else text on a terminal, json elsewhere."""
    if flag is not None:
        return flag
    value = env.get(LOG_FORMAT_ENV, "").strip()
    if value:
        if value not in LOG_FORMATS:
            raise UsageError(f"{LOG_FORMAT_ENV}: must be text or json, got {value!r}")
        return value
    isatty = getattr(stream, "isatty", None)
    return "text" if isatty is not None and isatty() else "json"


def plain_line(ts: float, level: str, logger: str, message: str) -> dict[str, Any]:
    """The line of a plain message (not an event): the one shape every writer uses."""
    return {
        "ts": round(ts, 3),
        "event": "log",
        "level": level.lower(),
        "logger": logger,
        "message": message,
    }


def line_of(record: logging.LogRecord, context: Mapping[str, Any] | None = None) -> dict:
    """The structured line of `record`, with `context` filled in where the line is silent."""
    own = getattr(record, LINE_ATTR, None)
    if own is None:
        own = plain_line(record.created, record.levelname, record.name, record.getMessage())
        request_id = current_request_id.get()
        if request_id is not None:
            own["request_id"] = request_id
    head = {key: own[key] for key in ("ts", "event") if key in own}
    extra = {key: value for key, value in (context or {}).items() if key not in own}
    return {**head, **extra, **own}


class _LineFormatter(logging.Formatter):
    def __init__(self, context: Mapping[str, Any] | None = None, *, worker: bool = False):
        super().__init__()
        self.context = {key: value for key, value in (context or {}).items() if value is not None}
        self.worker = worker

    def line(self, record: logging.LogRecord) -> dict:
        line = line_of(record, self.context)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return line


class JsonLineFormatter(_LineFormatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(self.line(record), default=str, separators=(",", ":"))


class TextLineFormatter(_LineFormatter):
    def format(self, record: logging.LogRecord) -> str:
        line = self.line(record)
        worker = self.worker or bool(getattr(record, WORKER_ATTR, False))
        level = str(line.get("level") or record.levelname).upper()
        if worker:
            source = _worker_source(line)
        elif LINE_ATTR in record.__dict__ and record.name == "sr.events":
            source = "sr"
        else:
            source = record.name
        # Control characters from callers (a path's %0d, %1b) would forge lines or drive
        # the operator's terminal: escaped, as JSON lines escape them.
        body = _body(line, worker).translate(_CONTROLS_BUT_NEWLINE)
        body = body.replace("\n", "\n  ")  # a message's own lines continue
        text = f"{_utc(line.get('ts'))} {level:<5} {source}: {body}"
        exception = line.get("exception")
        if exception:
            text += "".join(f"\n  {row}" for row in str(exception).splitlines())
        return text


def _utc(ts: Any) -> str:
    seconds = ts if isinstance(ts, int | float) else time.time()
    stamp = datetime.fromtimestamp(seconds, UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"


def _worker_source(line: dict) -> str:
    name = "/".join(str(line[key]) for key in ("deployment", "replica") if line.get(key))
    pid = f"[{line['pid']}]" if line.get("pid") is not None else ""
    return f"worker {name}{pid}" if name else f"worker{pid}"


def _body(line: dict, worker: bool) -> str:
    event = line.get("event")
    if event in (None, "log"):
        request_id = line.get("request_id")
        message = str(line.get("message", ""))
        return f"{message} request_id={request_id}" if request_id else message
    render = _EVENT_TEXT.get(str(event))
    if render is not None and not worker:
        return render(line)
    hidden = _PREFIX_KEYS | _WORKER_KEYS if worker else _PREFIX_KEYS
    return " ".join([str(event), *_pairs(line, hidden)])


def _pairs(line: dict, hidden: frozenset[str]) -> list[str]:
    """`key=value` for every field that says something (None says nothing)."""
    return [
        f"{key}={_value(value)}"
        for key, value in line.items()
        if key not in hidden and value is not None
    ]


def _value(value: Any) -> str:
    if isinstance(value, str):
        plain = value and not any(c.isspace() or c in "\"'=" for c in value)
        return value if plain else json.dumps(value)
    return json.dumps(value, default=str, separators=(",", ":"))


def _replica_state(line: dict) -> str:
    reason = line.get("reason")
    text = f"{line.get('deployment')} replica {line.get('replica')}: {line.get('state')}"
    return f"{text} ({reason})" if reason else text


def _access(line: dict) -> str:
    route = str(line.get("route")).translate(_CONTROLS)
    head = f"{line.get('method')} {route} {line.get('status')} {line.get('ms')}ms"
    shown = ("request_id", "deployment", "replica", "tokens")
    return " ".join([head, *_pairs({k: line.get(k) for k in shown}, frozenset())])


# C0 controls, DEL and C1 controls as \xNN escapes; the second table keeps newlines.
_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(0x20), *range(0x7F, 0xA0)]}
_CONTROLS_BUT_NEWLINE = {c: e for c, e in _CONTROLS.items() if c != 0x0A}

_EVENT_TEXT: dict[str, Callable[[dict], str]] = {
    "replica_state": _replica_state,
    "access": _access,
}


# The formatter `configure_logging` installed last, for `format_unlocked`.
_configured: logging.Formatter | None = None


def configure_logging(
    stream: TextIO | None = None,
    level: int = logging.INFO,
    *,
    log_format: str = "json",
    context: Mapping[str, Any] | None = None,
    worker: bool = False,
) -> None:
    """Send every `sr` logger to `stream` (stderr) in `log_format`; idempotent.

    `context` is stamped on every line (a worker's deployment, replica and pid); `worker`
    makes text lines name the worker as their source."""
    global _configured
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log_format must be one of {LOG_FORMATS}, got {log_format!r}")
    logger = logging.getLogger("sr")
    for handler in list(logger.handlers):
        if getattr(handler, "_sr_log", False):
            logger.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    formatter = TextLineFormatter if log_format == "text" else JsonLineFormatter
    _configured = formatter(context, worker=worker)
    handler.setFormatter(_configured)
    handler._sr_log = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


def format_unlocked(record: logging.LogRecord) -> str:
    """`record` as this process's sr handler (`configure_logging`) writes it, JSON when none
    is configured, without taking any logging lock: for last words written straight to
    fd 2 by a thread that must not wait on a thread that is stuck (sr.worker.parent_watch)."""
    return (_configured or JsonLineFormatter()).format(record)


class AccessLog:
    """One line per answered request on `sr.access`, in the process's log format.

    Off unless `enabled`: then `record` returns after one attribute check. `ms` is the
    time from the request's first byte to its answer; `tokens` the input tokens when the
    worker said (None otherwise); `replica` None when no replica was asked."""

    def __init__(self, enabled: bool = False, logger: logging.Logger | None = None):
        self.enabled = enabled
        self._logger = logger or logging.getLogger("sr.access")

    def record(
        self,
        *,
        request_id: str | None,
        method: str,
        route: str,
        deployment: str | None,
        replica: str | None,
        status: int,
        ms: float,
        tokens: int | None,
    ) -> None:
        if not self.enabled:
            return
        line = {
            "ts": round(time.time(), 3),
            "event": "access",
            "request_id": request_id,
            "method": method,
            "route": route,
            "deployment": deployment,
            "replica": replica,
            "status": status,
            "ms": round(ms, 1),
            "tokens": tokens,
        }
        self._logger.info("%s %s %s", method, route, status, extra={LINE_ATTR: line})
