"""Exit when the parent is gone: `--parent-fd N` is the read end of a pipe nobody writes.

The supervisor (the router's pool) keeps the write end open for as long as it wants this
worker; when its process dies, by SIGKILL included, the kernel closes that end and the
read here returns EOF. The worker then leaves at once with `os._exit(3)`: its callers are
gone with the router, so a graceful drain would only keep an orphan (and its memory and
device) alive for nobody.

Why a thread and not a trio task: it must fire while the trio loop or the device thread
is busy or stuck; a blocking `os.read` in a daemon thread needs neither of them.

Why not `prctl(PR_SET_PDEATHSIG)`: the death signal follows the *thread* that forked the
child, not the process (prctl(2)). `trio.lowlevel.open_process` forks from a trio cache
thread, which exits after ~10 s idle, so PDEATHSIG kills healthy workers ten seconds after
their start (tried: trio 0.35, Linux, child SIGKILLed at t=10 s).
"""

from __future__ import annotations

import logging
import os
import threading

from sr.logs import format_unlocked

PARENT_GONE_EXIT = 3


def watch_parent_fd(fd: int) -> threading.Thread:
    """Start the daemon thread that ends this process once `fd` reads EOF (or fails)."""
    os.set_blocking(fd, True)  # a non-blocking fd would "fail" at once with EAGAIN
    thread = threading.Thread(
        target=_exit_when_closed, args=(fd,), name="sr-parent-watch", daemon=True
    )
    thread.start()
    return thread


def _exit_when_closed(fd: int) -> None:
    reason = "--parent-fd closed"
    try:
        while os.read(fd, 1):
            pass  # nothing is meant to be written; a stray byte is not a death notice
    except OSError as error:
        reason = f"--parent-fd unreadable: {error.strerror or error}"
    message = f"parent gone ({reason}); exiting"
    # A bare LogRecord: getLogger and handlers would take logging's locks.
    record = logging.LogRecord("sr.worker", logging.WARNING, __file__, 0, message, None, None)
    try:  # straight to fd 2: the logging lock may be held by a thread that is stuck
        os.write(2, (format_unlocked(record) + "\n").encode())
    except OSError:
        pass  # stderr was the dead parent's pipe
    os._exit(PARENT_GONE_EXIT)
