"""The router's own run folder (worker sockets): claimed with a lock, swept once dead.

A router that sr starts makes `sr-<random>` in the temp directory and holds `router.lock` in
it with `flock` for as long as it runs. The kernel drops a flock when its holder dies,
SIGKILL included, so "the lock can be taken" means "its router is dead" with no pid to be
reused. The next router removes such folders before it makes its own; it never touches a
folder whose lock is held, one without a lock (not ours to judge), one owned by another
user, or a symlink.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

from sr.http.private_folder import ensure_private_folder

PREFIX = "sr-"
LOCK_NAME = "router.lock"

_log = logging.getLogger("sr.pool")


def claim_run_dir(parent: Path | None = None) -> tuple[Path, int]:
    """A new private `sr-<random>` folder under `parent` (the temp directory) and the fd that
    holds its lock; close the fd only after removing the folder."""
    path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
    ensure_private_folder(path, label="run_dir: the worker socket folder")
    # Locked under a temporary name, then renamed: a sweeping router never sees a
    # `router.lock` that nobody holds yet. Never inherited (os.open's default, spelled
    # out): a worker holding it would make its dead router look alive.
    pending = path / f".{LOCK_NAME}"
    fd = os.open(pending, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(pending, path / LOCK_NAME)
    except BaseException:
        os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path, fd


def remove_stale_run_dirs(parent: Path) -> list[Path]:
    """Remove the run folders in `parent` whose router is dead; the ones removed."""
    removed = []
    try:
        names = sorted(os.listdir(parent))
    except OSError as error:
        _log.debug("run folder sweep: cannot list %s: %s", parent, error)
        return removed
    for name in names:
        path = Path(parent) / name
        if name.startswith(PREFIX) and _is_dead_router_dir(path):
            shutil.rmtree(path, ignore_errors=True)
            if os.path.lexists(path):
                _log.debug("run folder sweep: could not remove all of %s", path)
            else:
                removed.append(path)
    return removed


def _is_dead_router_dir(path: Path) -> bool:
    try:
        info = os.lstat(path)  # lstat: a symlink is never followed, let alone removed
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        return False
    try:
        fd = os.open(path / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False  # no lock file: not a folder this scheme made
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # held: its router is alive
    finally:
        os.close(fd)  # a second sweeper racing us only finds less to remove
    return True
