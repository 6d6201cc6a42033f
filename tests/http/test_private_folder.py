"""sr.http.private_folder and its users: socket folders are private, existing ones never
chmodded."""

from __future__ import annotations

import os
import stat

import pytest

from sr.config.schema import default_config
from sr.errors import UsageError
from sr.http.private_folder import ensure_private_folder
from sr.pool import open_router


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_missing_folder_is_created_0700_despite_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        ensure_private_folder(tmp_path / "a" / "b", label="x")
    finally:
        os.umask(old)
    assert mode(tmp_path / "a" / "b") == 0o700


@pytest.mark.parametrize("shared", [0o755, 0o1777, 0o710])
def test_shared_folder_is_refused_and_left_as_it_was(tmp_path, shared):
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(shared)
    with pytest.raises(UsageError, match=rf"x {folder} is shared \(mode {shared:o}\)"):
        ensure_private_folder(folder, label="x")
    assert mode(folder) == shared


def test_a_file_is_not_a_folder(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(UsageError, match="is not a directory"):
        ensure_private_folder(tmp_path / "f", label="x")


async def test_open_router_refuses_a_shared_run_dir_before_starting_anything(tmp_path):
    tmp_path.chmod(0o755)
    with pytest.raises(UsageError, match="run_dir: the worker socket folder"):
        async with open_router(default_config(), run_dir=tmp_path, threads=1):
            pytest.fail("the router must not start")
    assert mode(tmp_path) == 0o755
