"""sr.pool.run_dir: a dead router's run folder is swept; nothing else ever is."""

from __future__ import annotations

import logging
import os
import signal
import stat
import subprocess
import sys

from sr.pool.run_dir import LOCK_NAME, claim_run_dir, remove_stale_run_dirs
from tests.serve_process import REPO_ROOT


def _dead_router_dir(parent):
    path, fd = claim_run_dir(parent)
    (path / "primary-1-1.sock").write_bytes(b"")
    os.close(fd)  # what the kernel does when the router dies
    return path


def test_claim_makes_a_private_sr_folder_with_a_held_lock_and_no_inheritable_fd(tmp_path):
    path, fd = claim_run_dir(tmp_path)
    try:
        assert path.parent == tmp_path and path.name.startswith("sr-")
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
        assert sorted(os.listdir(path)) == [LOCK_NAME]
        assert not os.get_inheritable(fd)  # workers must not keep a dead router "alive"
        assert remove_stale_run_dirs(tmp_path) == []
        assert path.is_dir()
    finally:
        os.close(fd)


def test_a_dead_routers_folder_is_removed_a_live_one_kept(tmp_path):
    dead = _dead_router_dir(tmp_path)
    live, live_fd = claim_run_dir(tmp_path)
    try:
        assert remove_stale_run_dirs(tmp_path) == [dead]
        assert not dead.exists() and (live / LOCK_NAME).exists()
    finally:
        os.close(live_fd)


def test_the_folder_of_a_sigkilled_router_process_is_removed(tmp_path):
    program = (
        "import sys, time; from pathlib import Path; from sr.pool.run_dir import claim_run_dir\n"
        "path, _ = claim_run_dir(Path(sys.argv[1])); print(path, flush=True); time.sleep(30)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", program, str(tmp_path)], stdout=subprocess.PIPE, env=env
    )
    try:
        path = tmp_path / os.path.basename(child.stdout.readline().decode().strip())
        assert path.is_dir()
        assert remove_stale_run_dirs(tmp_path) == []  # its router is alive
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=5)
        assert remove_stale_run_dirs(tmp_path) == [path]
    finally:
        child.kill()
        child.wait(timeout=5)


def test_folders_without_a_lock_other_names_and_symlinks_are_never_touched(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="sr.pool")
    parent = tmp_path / "tmp"
    parent.mkdir()
    no_lock = parent / "sr-nolock"
    no_lock.mkdir()
    (no_lock / "x.sock").write_bytes(b"")
    other_name = _dead_router_dir(parent).rename(parent / "other-abc")
    elsewhere = _dead_router_dir(tmp_path)
    (parent / "sr-link").symlink_to(elsewhere, target_is_directory=True)
    (parent / "sr-file").write_bytes(b"")
    lock_link = parent / "sr-locklink"  # router.lock a symlink: not followed
    lock_link.mkdir()
    (lock_link / LOCK_NAME).symlink_to(elsewhere / LOCK_NAME)

    assert remove_stale_run_dirs(parent) == []
    assert (no_lock / "x.sock").exists() and (other_name / LOCK_NAME).exists()
    assert (parent / "sr-link").is_symlink() and (elsewhere / LOCK_NAME).exists()
    assert (parent / "sr-file").exists() and (lock_link / LOCK_NAME).is_symlink()
    assert caplog.records == []  # not even tried (rmtree would refuse the symlink anyway)


def test_another_users_folder_is_never_touched(tmp_path, monkeypatch):
    dead = _dead_router_dir(tmp_path)
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(dead).st_uid + 1)
    assert remove_stale_run_dirs(tmp_path) == []
    monkeypatch.undo()
    assert remove_stale_run_dirs(tmp_path) == [dead]  # the same folder, once it is ours


def test_a_missing_parent_sweeps_nothing(tmp_path):
    assert remove_stale_run_dirs(tmp_path / "absent") == []
