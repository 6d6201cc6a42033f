"""JSON log lines on stderr and the startup lines on stdout."""

from __future__ import annotations

import io
import json
import logging

from sr.events import EventSink
from sr.router.logs import configure_logging
from sr.router.startup import StartupProgress


def test_every_sr_log_line_is_json():
    stream = io.StringIO()
    configure_logging(stream)
    configure_logging(stream)  # idempotent: one handler, one line per record
    try:
        EventSink().emit("replica_state", deployment="primary", replica="primary-0", state="ready")
        logging.getLogger("sr.http").info("Running on http://127.0.0.1:1")
        try:
            raise ValueError("bad")
        except ValueError:
            logging.getLogger("sr.events").exception("router_internal_error")
    finally:
        logger = logging.getLogger("sr")
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["event"] for line in lines] == ["replica_state", "log", "log"]
    assert lines[0]["state"] == "ready"
    assert lines[1]["logger"] == "sr.http"
    assert "ValueError: bad" in lines[2]["exception"]


def test_startup_prints_each_change_once_until_ready():
    out = io.StringIO()
    progress = StartupProgress(out)
    sink = EventSink(log=False)
    sink.subscribe(progress.on_event)
    sink.emit("replica_state", deployment="p", replica="p-0", state="starting", reason=None)
    sink.emit("replica_state", deployment="p", replica="p-0", state="starting", reason=None)
    sink.emit("replica_state", deployment="p", replica="p-1", state="failed", reason="OOM")
    sink.emit("replica_ejected", deployment="p", replica="p-0")
    progress.ready("http://127.0.0.1:8899")
    sink.emit("replica_state", deployment="p", replica="p-0", state="backoff")
    assert out.getvalue().splitlines() == [
        "sr: p replica p-0: starting",
        "sr: p replica p-1: failed (OOM)",
        "sr: ready, serving on http://127.0.0.1:8899",
    ]
