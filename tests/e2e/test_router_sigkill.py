"""No worker outlives its router, SIGKILL included; the next router sweeps its folder."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.chaos.harness import write_report_row
from tests.serve_process import ServeProcess, poll_until, serve_config, wait_gone

pytestmark = pytest.mark.e2e


def _run_dirs(tmpdir: Path) -> set[Path]:
    return set(tmpdir.glob("sr-*"))


def _pipe_inodes(pid: int) -> set[str]:
    fds = Path(f"/proc/{pid}/fd")
    links = {os.readlink(fd) for fd in fds.iterdir() if fd.name.isdigit()}
    return {link for link in links if link.startswith("pipe:")}


def _parent_pipe(pid: int) -> str:
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    fd = args[args.index(b"--parent-fd") + 1].decode()
    return os.readlink(f"/proc/{pid}/fd/{fd}")


def test_sigkilled_router_takes_its_workers_and_the_next_one_sweeps_its_folder(
    tmp_path, tiny_model_dir
):
    tmpdir = tmp_path / "tmp"  # TMPDIR of both routers: their run folders, isolated
    tmpdir.mkdir()
    env = {"TMPDIR": str(tmpdir)}
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    first = ServeProcess(tmp_path / "first", serve_config(tiny_model_dir, 2), env=env)
    second = ServeProcess(tmp_path / "second", serve_config(tiny_model_dir, 1), env=env)
    try:
        first.start(timeout_s=60)
        pids = first.worker_pids()
        assert len(pids) == 2, first.logs()
        (stale,) = _run_dirs(tmpdir)
        # Each worker holds only its own parent pipe, not its sibling's write end (which
        # would keep that sibling alive after the router is gone).
        own = {pid: _parent_pipe(pid) for pid in pids}
        for pid in pids:
            others = {own[p] for p in pids if p != pid}
            assert not others & _pipe_inodes(pid)

        killed = time.monotonic()
        os.kill(first.proc.pid, signal.SIGKILL)
        first.wait(10)
        assert wait_gone(pids, 2.0) == [], "workers outlived their SIGKILLed router"
        gone_s = time.monotonic() - killed
        assert stale.is_dir()  # nobody cleaned up: the next router must

        second.start(timeout_s=60)
        assert not stale.exists()
        assert len(_run_dirs(tmpdir)) == 1  # the second router's own
        (swept,) = poll_until(lambda: second.events("stale_run_dirs_removed"), 5, "sweep event")
        assert swept["folders"] == [str(stale)]
        write_report_row(
            {"scenario": "sigkill_router", "sent": 0, "ok": 0, "errors": {}, "lost": 0,
             "max_latency_ms": 0, "workers": len(pids), "workers_gone_s": round(gone_s, 2),
             "stale_folder_swept": True}
        )  # fmt: skip
    finally:
        assert second.stop() == []
        first.stop()
