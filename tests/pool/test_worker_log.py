"""A managed worker's stderr relayed into the router's log, and its exit in words."""

from __future__ import annotations

import json
import logging
import signal
import sys
import textwrap

import pytest
import trio

from sr.config.schema import Deployment, Replica, SrConfig
from sr.events import LINE_ATTR, RecordingSink
from sr.logs import JsonLineFormatter, TextLineFormatter
from sr.pool import open_router
from sr.pool import replica as replica_module
from sr.pool.worker_log import WorkerLogRelay, describe_exit


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def relayed():
    """The records the relay logs on `sr.worker`."""
    logger = logging.getLogger("sr.worker.test")
    logger.setLevel(logging.DEBUG)
    handler = Records()
    logger.addHandler(handler)
    yield logger, handler.records
    logger.removeHandler(handler)


def _worker_line(**fields) -> bytes:
    return json.dumps({"ts": 1767225600.25, **fields}).encode() + b"\n"


def test_lines_split_across_chunks_keep_the_workers_own_fields(relayed):
    logger, records = relayed
    relay = WorkerLogRelay(deployment="primary", replica="primary-0", pid=77, logger=logger)
    state = _worker_line(event="worker_state", replica="own-id", pid=5, state="loading")
    log = _worker_line(event="log", level="warning", logger="sr.worker", message="slow")
    relay.feed(state[:10])
    relay.feed(state[10:] + log[:-5])
    assert len(records) == 1  # the second line is not complete yet
    relay.feed(log[-5:])
    first, second = (r.__dict__[LINE_ATTR] for r in records)
    assert first == {
        "ts": 1767225600.25,
        "event": "worker_state",
        "replica": "own-id",  # what the worker says of itself wins
        "pid": 5,
        "state": "loading",
        "deployment": "primary",  # filled in where the line was silent
    }
    assert (records[1].levelno, second["message"], second["replica"]) == (
        logging.WARNING,
        "slow",
        "primary-0",
    )
    assert relay.last_message == "slow"


def test_raw_lines_become_stamped_warnings_and_an_unterminated_tail_is_not_lost(relayed):
    logger, records = relayed
    relay = WorkerLogRelay(deployment="primary", replica="primary-0", pid=77, logger=logger)
    relay.feed(b"Traceback (most recent call last):\n\n  File 'x'\n{not json\n")
    relay.feed(b"RuntimeError: CUDA out of memory")
    assert len(records) == 3  # the blank line is dropped, the tail waits for its newline
    relay.close()
    lines = [r.__dict__[LINE_ATTR] for r in records]
    assert [line["message"] for line in lines] == [
        "Traceback (most recent call last):",
        "  File 'x'",
        "{not json",
        "RuntimeError: CUDA out of memory",
    ]
    assert {(r.levelno, r.__dict__[LINE_ATTR]["logger"]) for r in records} == {
        (logging.WARNING, "sr.worker.stderr")
    }
    assert all(line["pid"] == 77 and line["deployment"] == "primary" for line in lines)
    assert relay.last_message == "RuntimeError: CUDA out of memory"


def test_an_endless_line_is_relayed_in_bounded_pieces(relayed):
    logger, records = relayed
    relay = WorkerLogRelay(deployment="d", replica="r", pid=1, logger=logger)
    relay.feed(b"x" * 200_000)
    assert [len(r.__dict__[LINE_ATTR]["message"]) for r in records] == [65536] * 3
    assert len(relay.last_message) == 300


def test_a_line_saying_the_worker_listens_or_changed_state_wakes_its_runner(relayed):
    """The runner probes at once rather than at its next turn (0.1 s while starting)."""
    logger, _ = relayed
    woken = []
    relay = WorkerLogRelay(
        deployment="d", replica="r", pid=1, logger=logger, on_state=lambda: woken.append(1)
    )
    relay.feed(
        b'{"ts": 1, "event": "model_loaded"}\n{"ts": 1, "event": "worker_listening", "binds": []}\n'
    )
    assert len(woken) == 1
    relay.feed(
        b'{"ts": 1, "event": "worker_state", "state": "warming"}\nworker_state in plain text\n'
    )
    relay.feed(b'{"ts": 1, "event": "worker_state", "sta')
    assert len(woken) == 2  # not for a plain line, nor a line not yet whole
    relay.feed(b'te": "ready"}\n')
    assert len(woken) == 3


def test_relayed_lines_render_in_the_routers_format(relayed):
    logger, records = relayed
    relay = WorkerLogRelay(deployment="primary", replica="primary-0", pid=77, logger=logger)
    relay.feed(_worker_line(event="worker_listening", binds=["unix:/run/w.sock"]))
    relay.feed(b"plain words\n")
    text = [TextLineFormatter().format(r) for r in records]
    assert (
        text
        == [
            '2026-01-01T00:00:00.250Z INFO  worker primary/primary-0[77]: worker_listening binds=["unix:/run/w.sock"]',  # noqa: E501
            f"{text[1][:24]} WARNING worker primary/primary-0[77]: plain words",
        ]
    )
    as_json = json.loads(JsonLineFormatter().format(records[0]))
    assert as_json == {
        "ts": 1767225600.25,
        "event": "worker_listening",
        "binds": ["unix:/run/w.sock"],
        "deployment": "primary",
        "replica": "primary-0",
        "pid": 77,
    }


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"event": "log", "message": "cannot load\n  weights"}, "cannot load weights"),
        (
            {"event": "worker_state", "state": "failed", "reason": "no such file"},
            "worker_state: no such file",
        ),
        ({"event": "worker_stopping", "signal": "SIGTERM"}, "worker_stopping"),
    ],
)
def test_the_last_message_is_words_never_raw_json(relayed, line, message):
    logger, _ = relayed
    relay = WorkerLogRelay(deployment="d", replica="r", pid=1, logger=logger)
    relay.feed(_worker_line(**line))
    assert relay.last_message == message


def test_exits_in_words():
    assert describe_exit(-signal.SIGKILL, "ignored") == "killed by SIGKILL"
    assert describe_exit(-signal.SIGTERM) == "killed by SIGTERM"
    assert describe_exit(-99) == "killed by signal 99"
    assert describe_exit(1, "cannot load weights") == "exited 1: cannot load weights"
    assert describe_exit(3) == "exited 3"
    assert describe_exit(0, "worker_stopping") == "exited 0"


# -- through the replica runner, with real processes -------------------------------------
FAKE_WORKERS = {
    "exits": """
        import json, sys, time
        line = {"ts": time.time(), "event": "log", "level": "error", "logger": "sr.worker",
                "message": "cannot load weights: bad magic"}
        sys.stderr.write(json.dumps({"ts": time.time(), "event": "worker_state",
                                     "state": "loading"}) + "\\n")
        sys.stderr.write(json.dumps(line) + "\\n")
        sys.exit(1)
    """,
    "killed": """
        import json, os, signal, sys, time
        sys.stderr.write(json.dumps({"ts": time.time(), "event": "log", "level": "info",
                                     "logger": "sr.worker", "message": "loading"}) + "\\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    """,
}


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("exits", "exited 1: cannot load weights: bad magic; restarting in 1s"),
        ("killed", "killed by SIGKILL; restarting in 1s"),
    ],
)
async def test_a_managed_workers_exit_reason_and_lines(monkeypatch, tmp_path, kind, reason):
    script = textwrap.dedent(FAKE_WORKERS[kind])
    real_argv = replica_module.worker_argv
    argvs = []

    def fake_argv(*args, **kwargs):
        argvs.append(real_argv(*args, **kwargs))  # what sr would run, kept to check
        return [sys.executable, "-c", script]

    monkeypatch.setattr(replica_module, "worker_argv", fake_argv)
    handler = Records()
    worker_logger = logging.getLogger("sr.worker")
    worker_logger.addHandler(handler)
    level = worker_logger.level
    worker_logger.setLevel(logging.INFO)
    config = SrConfig()
    config.deployments["primary"] = Deployment(artifact="/m", replicas=[Replica(device="cpu")])
    sink = RecordingSink()
    try:
        with trio.fail_after(20):
            async with open_router(config, events=sink, threads=1, run_dir=tmp_path) as core:
                while not sink.named("replica_state") or (
                    sink.named("replica_state")[-1]["state"] != "restarting"
                ):
                    await trio.sleep(0.02)
                (row,) = core.inventory().deployments["primary"].replicas
    finally:
        worker_logger.removeHandler(handler)
        worker_logger.setLevel(level)
    assert sink.named("replica_state")[-1]["reason"] == reason
    assert row.reason == reason
    (replica_id,) = {e["replica"] for e in sink.named("replica_state")}
    argv = argvs[0]
    assert argv[argv.index("--deployment") + 1 :][:3] == ["primary", "--replica", replica_id]
    assert argv[argv.index("--log-format") + 1] == "json"
    lines = [r.__dict__[LINE_ATTR] for r in handler.records]
    assert lines and {(line["deployment"], line["replica"]) for line in lines} == {
        ("primary", replica_id)
    }


def test_managed_workers_are_named_and_log_json_whatever_the_environment(monkeypatch):
    from sr.worker.cli import parse_command

    monkeypatch.setenv("SR_LOG_FORMAT", "text")  # the router's own choice, not the pipe's
    argv = replica_module.worker_argv(
        Deployment(artifact="/m"), "cpu", 1, "/run/w.sock", names=("primary", "primary-1a2b")
    )
    command = parse_command(argv[argv.index("worker") + 1 :])
    assert command.log_format == "json"
    assert command.log_context == {
        "deployment": "primary",
        "replica": "primary-1a2b",
        "pid": command.log_context["pid"],
    }
    alone = parse_command(["--artifact", "/m", "--port", "0"])
    assert (alone.log_format, list(alone.log_context)) == ("text", ["pid"])
