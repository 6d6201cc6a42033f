"""`sr serve` as a real process, in each log format: every replica state change is one
line (in the log, never on stdout too), worker lines say whose they are, stdout has the
milestones with replica counts, and a SIGKILLed worker's reason is in words."""

from __future__ import annotations

import json
import os
import re
import signal

import pytest

from tests.serve_process import ServeProcess, poll_until, serve_config

pytestmark = pytest.mark.e2e

TEXT_LINE = re.compile(r"^(\S+Z) (INFO |WARNING|ERROR|DEBUG) (.+?): (.*)$")
WORKER_SOURCE = re.compile(r"^worker primary/(\S+)\[(\d+)\]$")


def _parse(stderr: str, log_format: str) -> list[dict]:
    """Every log line as {source, event, replica, state, reason, pid}; asserts the format."""
    rows = []
    for line in stderr.splitlines():
        if line.startswith("sr serve:"):
            continue  # the process's own last words (none in a clean run)
        if log_format == "json":
            record = json.loads(line)
            if record["event"] == "replica_state":
                rows.append({"event": "replica_state", **record})
            elif "pid" in record:  # a worker's line: it names itself
                rows.append({**record, "event": "worker"})
            continue
        if line.startswith("  "):
            continue  # a traceback's continuation
        match = TEXT_LINE.match(line)
        assert match, f"not a text log line: {line!r}"
        source, body = match.group(3), match.group(4)
        worker = WORKER_SOURCE.match(source)
        if worker:
            rows.append({"event": "worker", "replica": worker[1], "pid": int(worker[2])})
        elif source == "sr" and body.startswith("primary replica "):
            replica, _, rest = body.removeprefix("primary replica ").partition(": ")
            state, _, reason = rest.partition(" (")
            rows.append(
                {"event": "replica_state", "replica": replica, "state": state,
                 "reason": reason[:-1] or None}
            )  # fmt: skip
    return rows


def _changes(rows: list[dict]) -> list[tuple[str, str]]:
    return [(r["replica"], r["state"]) for r in rows if r["event"] == "replica_state"]


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_each_state_change_is_one_log_line_and_stdout_counts_replicas(
    tmp_path, tiny_model_dir, log_format
):
    router = ServeProcess(
        tmp_path, serve_config(tiny_model_dir, 2), env={"SR_LOG_FORMAT": log_format}
    )
    try:
        router.start(timeout_s=60)
        poll_until(lambda: "all replicas ready" in router.stdout_text(), 10, "all-ready line")
        replicas = {r["id"]: r["pid"] for r in router.replicas()}
        out = router.stdout_text().splitlines()
        assert out[0] == f"sr: listening on {router.url} (starting; /ready answers 503 until ready)"
        assert re.fullmatch(
            rf"sr: serving on {router.url}: [12]/2 replicas of primary ready", out[1]
        )
        assert out[2:] == ["sr: all replicas ready (2/2)"]

        rows = _parse(router.stderr_text(), log_format)
        changes = _changes(rows)
        assert len(changes) == len(set(changes)), changes  # no state line twice
        assert {(replica, "ready") for replica in replicas} <= set(changes)
        for replica, pid in replicas.items():  # the workers' own lines name them
            assert any(
                r["event"] == "worker" and r["replica"] == replica and r["pid"] == pid for r in rows
            ), f"no line of worker {replica}[{pid}]"

        victim, pid = next(iter(replicas.items()))
        os.kill(pid, signal.SIGKILL)

        def restarting() -> list[dict]:
            rows = _parse(router.stderr_text(), log_format)
            return [
                r for r in rows if (r["event"], r.get("state")) == ("replica_state", "restarting")
            ]

        (restart,) = poll_until(restarting, 10, "the restarting state line")
        assert restart["replica"] == victim
        assert restart["reason"] == "killed by SIGKILL; restarting in 1s"
        router.wait_all_ready(30)
        assert router.stdout_text().splitlines() == out  # later changes are the log's alone
    finally:
        assert router.stop() == []
