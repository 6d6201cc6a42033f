"""`prepare_uds` keeps the socket folder private without ever chmodding a folder it did not
make (an auditor's `--uds /tmp/x.sock` once turned /tmp into 0700)."""

from __future__ import annotations

import os
import socket
import stat

import pytest

from sr.errors import UsageError
from sr.worker import http


def mode_of(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_an_existing_shared_folder_is_refused_and_left_alone(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o755)
    with pytest.raises(UsageError, match=r"socket folder .*shared is shared \(mode 755\)"):
        http.prepare_uds(str(folder / "w.sock"))
    assert mode_of(folder) == 0o755


def test_a_sticky_world_writable_folder_is_refused(tmp_path):
    folder = tmp_path / "like-tmp"
    folder.mkdir()
    folder.chmod(0o1777)
    with pytest.raises(UsageError, match=r"mode 1777\); use a private folder"):
        http.prepare_uds(str(folder / "w.sock"))
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o1777


def test_a_missing_folder_is_created_0700_despite_the_umask(tmp_path):
    folder = tmp_path / "sockets"
    old = os.umask(0o277)  # makedirs(mode=0o700) alone would leave it 0500
    try:
        http.prepare_uds(str(folder / "w.sock"))
    finally:
        os.umask(old)
    assert mode_of(folder) == 0o700


def test_an_existing_private_folder_is_used_and_a_stale_socket_removed(tmp_path):
    folder = tmp_path / "private"
    folder.mkdir()
    folder.chmod(0o700)
    path = folder / "w.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))  # nobody listens: what a killed worker leaves
    stale.close()
    http.prepare_uds(str(path))
    assert not path.exists() and mode_of(folder) == 0o700


def test_a_folder_owned_by_someone_else_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / "theirs"
    folder.mkdir()
    folder.chmod(0o700)
    monkeypatch.setattr(http.os, "geteuid", lambda: os.stat(folder).st_uid + 1)
    with pytest.raises(UsageError, match=r"belongs to uid \d+, not to this user"):
        http.prepare_uds(str(folder / "w.sock"))


def test_a_live_socket_is_refused(tmp_path):
    path = tmp_path / "live.sock"
    tmp_path.chmod(0o700)
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(str(path))
        listener.listen(1)
        with pytest.raises(UsageError, match="in use"):
            http.prepare_uds(str(path))
    finally:
        listener.close()
