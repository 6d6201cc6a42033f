"""Log lines in either format, the access log, and the milestone lines on stdout."""

from __future__ import annotations

import io
import json
import logging
import re
import threading
from datetime import UTC, datetime

import attrs
import pytest
import trio

from sr import logs
from sr.errors import UsageError
from sr.events import EventSink
from sr.logs import AccessLog, configure_logging, format_unlocked, resolve_log_format
from sr.pool.views import DeploymentView, Inventory
from sr.router.serve import serve
from sr.router.startup import ReplicaCount, StartupProgress, replica_counts

from .fake_core import FakeRouterCore, fake_open_router, make_config

TEXT_LINE = re.compile(r"^(\S+Z) (INFO |WARNING|ERROR|DEBUG) (.+?): (.*)$")


@pytest.fixture
def log_to():
    """configure_logging into a StringIO; the `sr` logger is put back afterwards."""
    streams = []

    def configure(log_format: str, **kwargs) -> io.StringIO:
        stream = io.StringIO()
        configure_logging(stream, log_format=log_format, **kwargs)
        streams.append(stream)
        return stream

    yield configure
    logger = logging.getLogger("sr")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    logger.propagate = True
    logs._configured = None


def test_last_words_take_the_configured_format_without_waiting_on_logging_locks(log_to):
    """sr.worker.parent_watch writes through format_unlocked while another thread may be
    stuck holding logging's module lock or the handler's lock."""
    log_to("text", context={"deployment": "d", "replica": "r0", "pid": 7}, worker=True)
    (handler,) = logging.getLogger("sr").handlers
    record = logging.LogRecord("sr.worker", logging.WARNING, __file__, 0, "gone", None, None)
    held, release, written = threading.Event(), threading.Event(), []

    def hold_locks() -> None:
        with logging._lock, handler.lock:  # type: ignore[attr-defined]
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold_locks)
    holder.start()
    try:
        assert held.wait(5)
        writer = threading.Thread(target=lambda: written.append(format_unlocked(record)))
        writer.start()
        writer.join(5)
        assert written, "format_unlocked waited on a logging lock"
    finally:
        release.set()
        holder.join(5)
    match = TEXT_LINE.match(written[0])
    assert match is not None and match.groups()[1:] == ("WARNING", "worker d/r0[7]", "gone")
    logs._configured = None  # nothing configured: JSON, as a managed worker's stderr is
    assert json.loads(format_unlocked(record))["message"] == "gone"


def _log_a_bit() -> None:
    EventSink().emit("replica_state", deployment="primary", replica="primary-0", state="ready")
    EventSink().emit(
        "replica_ejected", deployment="primary", replica="primary-0", duration_ms=30000
    )
    logging.getLogger("sr.http").info("Running on http://127.0.0.1:1\n  and more")
    try:
        raise ValueError("bad")
    except ValueError:
        logging.getLogger("sr.events").exception("router_internal_error")


def test_json_every_sr_log_line_is_one_object(log_to):
    log_to("json")
    stream = log_to("json")  # idempotent: one handler, one line per record
    _log_a_bit()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["event"] for line in lines] == ["replica_state", "replica_ejected", "log", "log"]
    assert lines[0] == {
        "ts": lines[0]["ts"],
        "event": "replica_state",
        "deployment": "primary",
        "replica": "primary-0",
        "state": "ready",
    }
    assert lines[2]["logger"] == "sr.http" and lines[2]["level"] == "info"
    assert lines[3]["level"] == "error"
    assert "ValueError: bad" in lines[3]["exception"]


def test_text_one_readable_line_per_record_and_only_tracebacks_continue(log_to):
    stream = log_to("text")
    _log_a_bit()
    rows = stream.getvalue().splitlines()
    starts = [row for row in rows if not row.startswith("  ")]
    assert len(starts) == 4
    parsed = [TEXT_LINE.match(row) for row in starts]
    assert all(parsed), starts
    for match in parsed:  # an ISO 8601 UTC time, to the millisecond
        stamp = datetime.fromisoformat(match.group(1))
        assert stamp.tzinfo == UTC and abs((datetime.now(UTC) - stamp).total_seconds()) < 60
    assert [m.group(2, 3, 4) for m in parsed] == [
        ("INFO ", "sr", "primary replica primary-0: ready"),
        ("INFO ", "sr", "replica_ejected deployment=primary replica=primary-0 duration_ms=30000"),
        ("INFO ", "sr.http", "Running on http://127.0.0.1:1"),
        ("ERROR", "sr.events", "router_internal_error"),
    ]
    assert rows[rows.index(starts[2]) + 1] == "    and more"
    traceback = rows[rows.index(starts[-1]) + 1 :]
    assert traceback[0] == "  Traceback (most recent call last):"
    assert traceback[-1] == "  ValueError: bad"


def test_text_quotes_values_a_reader_could_not_split(log_to):
    stream = log_to("text")
    EventSink().emit(
        "config_reload_failed",
        error="replica p-2 failed: golden check",
        path="",
        deployments={"p": 3},
        forced=False,
        skipped=None,
    )
    line = stream.getvalue().rstrip("\n")
    body = TEXT_LINE.match(line).group(4)
    assert body == (
        'config_reload_failed error="replica p-2 failed: golden check" path="" '
        'deployments={"p":3} forced=false'
    )


def test_a_worker_stamps_its_names_and_pid_on_every_line(log_to):
    context = {"deployment": "primary", "replica": "primary-0", "pid": 4242}
    stream = log_to("json", context=context, worker=True)
    EventSink().emit("worker_state", state="loading", deployment="own")
    logging.getLogger("sr.worker").warning("slow forward")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    # context right after "event", never over the line's own field
    assert list(first) == ["ts", "event", "replica", "pid", "state", "deployment"]
    assert first["deployment"] == "own"
    assert {k: second[k] for k in ("deployment", "replica", "pid", "message", "level")} == {
        **context,
        "message": "slow forward",
        "level": "warning",
    }

    text = log_to("text", context=context, worker=True)
    EventSink().emit("worker_state", state="ready", reason=None)
    logging.getLogger("sr.worker").warning("slow forward")
    rows = [TEXT_LINE.match(row).group(2, 3, 4) for row in text.getvalue().splitlines()]
    assert rows == [
        ("INFO ", "worker primary/primary-0[4242]", "worker_state state=ready"),
        ("WARNING", "worker primary/primary-0[4242]", "slow forward"),
    ]


class _Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


def test_the_log_format_is_one_setting_flag_then_env_then_terminal():
    terminal, pipe = _Stream(True), _Stream(False)
    assert resolve_log_format(None, {}, terminal) == "text"
    assert resolve_log_format(None, {}, pipe) == "json"
    assert resolve_log_format(None, {"SR_LOG_FORMAT": "text"}, pipe) == "text"
    assert resolve_log_format(None, {"SR_LOG_FORMAT": " "}, pipe) == "json"  # blank: unset
    assert resolve_log_format("json", {"SR_LOG_FORMAT": "text"}, terminal) == "json"
    with pytest.raises(UsageError, match=r"SR_LOG_FORMAT: must be text or json, got 'xml'"):
        resolve_log_format(None, {"SR_LOG_FORMAT": "xml"}, terminal)


def _access(log: AccessLog, **overrides) -> None:
    fields = {
        "request_id": "req-7f3a",
        "method": "POST",
        "route": "/v1/embeddings",
        "deployment": "primary",
        "replica": "primary-1a2b3c4d",
        "status": 200,
        "ms": 12.345,
        "tokens": 17,
    }
    log.record(**{**fields, **overrides})


def test_access_log_is_off_by_default_and_one_line_per_request_when_on(log_to):
    stream = log_to("json")
    _access(AccessLog())
    assert stream.getvalue() == ""
    _access(AccessLog(enabled=True))
    _access(AccessLog(enabled=True), replica=None, tokens=None, status=404, deployment=None)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first == {
        "ts": first["ts"],
        "event": "access",
        "request_id": "req-7f3a",
        "method": "POST",
        "route": "/v1/embeddings",
        "deployment": "primary",
        "replica": "primary-1a2b3c4d",
        "status": 200,
        "ms": 12.3,
        "tokens": 17,
    }
    assert (second["status"], second["replica"], second["tokens"]) == (404, None, None)

    text = log_to("text")
    _access(AccessLog(enabled=True))
    _access(AccessLog(enabled=True), replica=None, tokens=None, status=404, deployment=None)
    rows = [TEXT_LINE.match(row).group(3, 4) for row in text.getvalue().splitlines()]
    assert rows == [
        (
            "sr.access",
            "POST /v1/embeddings 200 12.3ms request_id=req-7f3a deployment=primary"
            " replica=primary-1a2b3c4d tokens=17",
        ),
        ("sr.access", "POST /v1/embeddings 404 12.3ms request_id=req-7f3a"),
    ]


def test_a_disabled_access_log_does_not_touch_its_logger():
    class Exploding(logging.Logger):
        def info(self, *args, **kwargs):
            raise AssertionError("a disabled access log logged")

    _access(AccessLog(enabled=False, logger=Exploding("sr.access")))


# -- stdout milestones -------------------------------------------------------------------
class Counts:
    def __init__(self, **ready_of):
        self.now = {name: list(pair) for name, pair in ready_of.items()}

    def __call__(self) -> list[ReplicaCount]:
        return [ReplicaCount(name, ready, desired) for name, (ready, desired) in self.now.items()]


def _state(sink: EventSink, replica: str, state: str) -> None:
    sink.emit("replica_state", deployment="primary", replica=replica, state=state, reason=None)


def test_stdout_has_milestones_not_replica_states_and_all_ready_after_a_partial_start():
    out = io.StringIO()
    progress = StartupProgress(out)
    sink = EventSink(log=False)
    sink.subscribe(progress.on_event)
    _state(sink, "primary-0", "starting")
    progress.listening("http://127.0.0.1:8899")
    _state(sink, "primary-0", "ready")
    counts = Counts(primary=(1, 2))
    progress.ready("http://127.0.0.1:8899", counts)
    _state(sink, "primary-1", "loading")
    counts.now["primary"] = [2, 2]
    _state(sink, "primary-1", "ready")
    _state(sink, "primary-1", "ejected")  # later changes are the log's
    _state(sink, "primary-1", "ready")
    assert out.getvalue().splitlines() == [
        "sr: listening on http://127.0.0.1:8899 (starting; /ready answers 503 until ready)",
        "sr: serving on http://127.0.0.1:8899: 1/2 replicas of primary ready",
        "sr: all replicas ready (2/2)",
    ]


def test_a_full_start_prints_serving_then_all_ready_at_once_for_every_deployment():
    out = io.StringIO()
    StartupProgress(out).ready("http://h:1", Counts(primary=(2, 2), rerank=(1, 1)))
    assert out.getvalue().splitlines() == [
        "sr: serving on http://h:1: 2/2 replicas of primary, 1/1 of rerank ready",
        "sr: each deployment's own base URL: http://h:1/d/primary/, http://h:1/d/rerank/",
        "sr: all replicas ready (3/3)",
    ]


def test_replica_counts_read_the_inventory():
    def deployment(desired: int, ready: int) -> DeploymentView:
        return DeploymentView("/m", desired, ready, "degraded", 0, replicas=())

    inventory = Inventory(
        ready=False, deployments={"primary": deployment(2, 1), "rerank": deployment(1, 0)}
    )
    assert replica_counts(inventory) == [
        ReplicaCount("primary", 1, 2),
        ReplicaCount("rerank", 0, 1),
    ]


class PartlyReadyCore(FakeRouterCore):
    """A fake pool whose ready replica counts the test sets."""

    ready_now: int = 0

    def inventory(self):
        inventory = super().inventory()
        deployments = {
            name: attrs.evolve(row, ready_replicas=self.ready_now)
            for name, row in inventory.deployments.items()
        }
        return attrs.evolve(inventory, deployments=deployments)


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_serve_shows_each_replica_state_once_across_stdout_and_the_log(log_to, log_format):
    err, out = log_to(log_format), io.StringIO()
    sink = EventSink()  # logs, as sr serve's does
    cores: list[PartlyReadyCore] = []

    def make(config):
        core = PartlyReadyCore(config)
        core.ready = False
        return core

    def state(replica: str, name: str) -> None:
        sink.emit("replica_state", deployment="primary", replica=replica, state=name, reason=None)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            handle = await nursery.start(
                lambda task_status: serve(
                    make_config({"primary": 2}), host="127.0.0.1", port=0, events=sink,
                    ready_timeout_s=5, open_router=fake_open_router(cores, make), out=out,
                    task_status=task_status,
                )
            )  # fmt: skip
            for replica in ("primary-0", "primary-1"):
                state(replica, "starting")
            cores[0].ready_now, cores[0].ready = 1, True
            state("primary-0", "ready")
            while "sr: serving on" not in out.getvalue():
                await trio.sleep(0.01)
            state("primary-1", "loading")
            cores[0].ready_now = 2
            state("primary-1", "ready")
            handle.shutdown()
    url = handle.url
    assert out.getvalue().splitlines() == [
        f"sr: listening on {url} (starting; /ready answers 503 until ready)",
        f"sr: serving on {url}: 1/2 replicas of primary ready",
        "sr: all replicas ready (2/2)",
    ]
    if log_format == "json":
        lines = [json.loads(line) for line in err.getvalue().splitlines()]
        changes = [(e["replica"], e["state"]) for e in lines if e["event"] == "replica_state"]
    else:
        bodies = [TEXT_LINE.match(line).group(4) for line in err.getvalue().splitlines()]
        changes = [
            tuple(body.removeprefix("primary replica ").split(": "))
            for body in bodies
            if body.startswith("primary replica ")
        ]
    assert changes == [
        ("primary-0", "starting"),
        ("primary-1", "starting"),
        ("primary-0", "ready"),
        ("primary-1", "loading"),
        ("primary-1", "ready"),
    ]


def test_text_lines_escape_the_control_characters_a_caller_sends(log_to):
    text = log_to("text")
    _access(AccessLog(enabled=True), route="/x\rFORGED 200 1ms\n\x1b[31mred\x85")
    lines = text.getvalue().splitlines()
    assert len(lines) == 1
    assert "/x\\x0dFORGED 200 1ms\\x0a\\x1b[31mred\\x85 200" in lines[0]
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in lines[0])
    # JSON lines already escape them, as JSON does
    stream = log_to("json")
    _access(AccessLog(enabled=True), route="/x\r\x1b")
    assert json.loads(stream.getvalue())["route"] == "/x\r\x1b"
