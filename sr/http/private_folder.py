"""Private folders for Unix sockets: created 0700, or checked, never chmodded.

Worker sockets must not be reachable by other local users. A folder sr creates is made
0700; an existing one is only checked (chmodding `/tmp` because someone passed
`--uds /tmp/x.sock` would lock everyone else out of it).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sr.errors import UsageError


def ensure_private_folder(folder: Path, *, label: str) -> None:
    """Create `folder` 0700, or require an existing one to be ours and closed to others.
    `label` starts the one-line UsageError, e.g. "--uds: the socket folder"."""
    try:
        os.makedirs(folder, mode=0o700)
    except FileExistsError:
        pass
    else:
        os.chmod(folder, 0o700)  # makedirs' mode is masked by the umask; ours only, just made
        return
    info = os.stat(folder)
    if not stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{label} {folder} is not a directory")
    if info.st_uid != os.geteuid():
        raise UsageError(
            f"{label} {folder} belongs to uid {info.st_uid}, not to this user "
            f"(uid {os.geteuid()}); use a private folder"
        )
    if info.st_mode & 0o077:
        raise UsageError(
            f"{label} {folder} is shared (mode {stat.S_IMODE(info.st_mode):o}); "
            "use a private folder"
        )
