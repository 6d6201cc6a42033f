"""`--parent-fd`: a worker exits (status 3) once its parent's end of the pipe is closed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sr.worker.cli import main, parse_command
from sr.worker.parent_watch import PARENT_GONE_EXIT
from tests.serve_process import REPO_ROOT

# The main thread sleeps, as a busy or stuck trio loop would: only the watcher can act.
WATCHED_CHILD = """
import sys, time
from sr.worker.parent_watch import watch_parent_fd
watch_parent_fd(int(sys.argv[1]))
print("watching", flush=True)
time.sleep(30)
"""


def _spawn(argv: list[str], read_fd: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    try:
        return subprocess.Popen(
            argv,
            pass_fds=(read_fd,),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=REPO_ROOT,
        )
    finally:
        os.close(read_fd)  # the parent keeps only the write end, as the pool does


def _watched_child(read_fd: int) -> subprocess.Popen:
    child = _spawn([sys.executable, "-c", WATCHED_CHILD, str(read_fd)], read_fd)
    assert child.stdout.readline() == b"watching\n"
    return child


def _assert_parent_gone_line(stderr: bytes) -> None:
    (line,) = stderr.decode().splitlines()
    record = json.loads(line)
    assert record["level"] == "warning" and record["logger"] == "sr.worker"
    assert "parent gone" in record["message"]


def test_closing_the_write_end_ends_the_child_with_status_3():
    read_fd, write_fd = os.pipe()
    child = _watched_child(read_fd)
    try:
        os.close(write_fd)
        assert child.wait(timeout=2) == PARENT_GONE_EXIT == 3
        _assert_parent_gone_line(child.stderr.read())
    finally:
        child.kill()
        child.wait(timeout=5)


def test_the_child_keeps_running_while_the_write_end_is_open():
    read_fd, write_fd = os.pipe()
    child = _watched_child(read_fd)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=1.0)
    finally:
        child.kill()
        child.wait(timeout=5)
        os.close(write_fd)


def test_sr_worker_whose_parent_is_already_gone_exits_at_once(tmp_path, tiny_model_dir):
    # Through the real CLI: the watcher starts before the model loads, not after.
    read_fd, write_fd = os.pipe()
    os.close(write_fd)
    argv = [sys.executable, "-m", "sr", "worker", "--artifact", str(tiny_model_dir)]
    argv += ["--uds", str(tmp_path / "w.sock"), "--parent-fd", str(read_fd)]
    child = _spawn(argv, read_fd)
    try:
        assert child.wait(timeout=10) == 3
        _, err = child.communicate(timeout=5)
        assert b"parent gone" in err
        assert not (tmp_path / "w.sock").exists()  # it never got as far as listening
    finally:
        child.kill()
        child.wait(timeout=5)


def _closed_fd() -> int:
    fd = os.open(os.devnull, os.O_RDONLY)
    os.close(fd)
    return fd


@pytest.mark.parametrize(
    ("value", "message"),
    [("closed", "is not an open file descriptor"), ("-1", "must be >= 0")],
)
def test_a_parent_fd_that_is_not_open_is_a_one_line_usage_error(tmp_path, capsys, value, message):
    fd = str(_closed_fd()) if value == "closed" else value
    code = main(["--artifact", "x", "--uds", str(tmp_path / "w.sock"), "--parent-fd", fd])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sr worker: --parent-fd: ")
    assert message in err


def test_parent_fd_is_optional_and_parsed_when_given():
    read_fd, write_fd = os.pipe()
    try:
        assert parse_command(["--artifact", "x", "--port", "0"]).parent_fd is None
        argv = ["--artifact", "x", "--port", "0", "--parent-fd", str(read_fd)]
        assert parse_command(argv).parent_fd == read_fd
    finally:
        os.close(read_fd)
        os.close(write_fd)
