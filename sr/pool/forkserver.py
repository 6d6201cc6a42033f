"""The fork server: one process that imports torch and sr's worker once, then forks workers.

`python -m sr.pool.forkserver --control-fd N` is started by the router (sr.pool.forked).
Every `import torch` costs a process ~140 MiB of private memory (Python objects, operator
tables); forked from one parent that imported it, replicas share those pages copy-on-write.

Rules:
* Control channel: fd N, one end of a SOCK_SEQPACKET socketpair, one JSON message per
  packet. At start the server sends `{"ready": true, "pid": P}` (or `{"error": ...}` and
  exits 1). A request is `{"argv", "env", "cwd"}` with three fds attached (SCM_RIGHTS):
  the reply socket, the worker's stderr (write end) and its `--parent-fd` (read end). On
  the reply socket the server answers `{"pid": P}` with a pidfd of the child attached (the
  router signals through it: no pid-reuse race), or `{"error": why}`; once the child is
  reaped, `{"returncode": R}` (subprocess's convention: -9 for SIGKILL), then it closes it.
* EOF on the control channel — the router closed it or died, however — ends the server.
  Its workers do not depend on it: each watches the router's own pipe (its `--parent-fd`,
  sr.worker.parent_watch), so they exit with the router, not with this server.
* Only `python -m sr worker ...` is forked (argv[1:4] must be `-m sr worker`); the value of
  `--parent-fd` is rewritten to the number the received fd has here.
* A request with `"model_server": true` forks a deployment's fork server instead: the
  third fd is its control channel (the router holds the other end), and the child loads
  the model its worker argv names (sr.worker.model_server), answers `{"ready": true, "pid",
  "kernel", "load_s"}` (or `{"error"}` and exits 1) there, then serves fork requests on it
  as this server does. The workers it forks find the model loaded: its weights, packed
  ones included, are copy-on-write pages shared by the replicas. Its cmdline is
  `... sr.pool.forkserver --model ARTIFACT`; EOF on its control channel ends it too.
* Fork only while this process has one thread: torch starts its OpenMP pool lazily on the
  first parallel operator, which the server never runs; the thread count is checked before
  every fork and a request is refused (the router then spawns) if it is not 1. CUDA is never
  initialised here; the router forks only CPU workers. `gc.freeze()` before each fork, so the
  child's collector never writes to the shared objects' pages.
* The child leaves the server's state behind: server fds closed, signal handlers and the
  wakeup fd reset to a fresh interpreter's, fds 0/1/2 = /dev/null, /dev/null, its stderr,
  the request's environment and cwd, Python's and numpy's random state reseeded from the OS
  (torch's default generator is put back to the seed it had at import, what a fresh process
  has), torch's thread count put back to its default (a deployment's server loads at 1),
  and its /proc cmdline rewritten to the worker's argv (tools and tests find `--uds` there).
  It runs `sr worker`'s main and leaves with `os._exit` after the atexit handlers.
"""

from __future__ import annotations

import array
import atexit
import ctypes
import gc
import json
import os
import random
import selectors
import signal
import socket
import sys
import traceback

from sr.collector import imports_uncollected
from sr.settings import replace_process_environment

# Modules every worker imports (sr.worker.cli imports the service lazily; families are
# imported by model_type): importing them here is what the children share.
PRELOAD = (
    "torch",
    "sr.worker.cli",
    "sr.worker.http",
    "sr.worker.service",
    "sr.models.encoder",
    "sr.models.golden",
    "sr.models.bert",
    "sr.models.distilbert",
    "sr.models.mpnet",
    "sr.models.deberta",
    "sr.models.modernbert",
    "sr.models.qwen3",
    "sr.models.gemma3",
    "sr.models.heads",
    "sr.worker.token_classify",
    "sr.worker.model_server",  # what a model's fork server runs (see `_model_server`)
)
MAX_MESSAGE = 1 << 20  # also in sr.pool.forked
FDS_PER_REQUEST = 3  # reply socket, stderr write end, parent-fd read end
# Bytes of argv the server starts with, so a child can write its worker argv over them
# (sr.pool.forked passes them).
CMDLINE_ROOM = 4096


def main(argv: list[str]) -> int:
    control = socket.socket(fileno=int(argv[argv.index("--control-fd") + 1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is the router's to handle
    failure = import_preloaded()
    if failure is not None:  # reported to the router, which then spawns
        _send(control, {"error": failure})
        return 1
    try:  # the router signals forked workers through pidfds (Linux >= 5.3)
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError) as error:
        _send(control, {"error": f"no pidfd_open here: {error}"})
        return 1
    remember_fresh_state()
    set_cmdline([sys.executable, "-m", "sr.pool.forkserver", "--control-fd", str(control.fileno())])
    gc.freeze()
    _send(control, {"ready": True, "pid": os.getpid()})
    return _Server(control).serve()


def import_preloaded() -> str | None:
    """Import PRELOAD with the collector paused (sr.collector); None, or why an import
    failed. The collector is on again afterwards, so a forked worker starts with it on, as a
    new interpreter does."""
    with imports_uncollected():
        try:
            for name in PRELOAD:
                __import__(name)
        except BaseException as error:
            return f"cannot import {name}: {type(error).__name__}: {error}"
    return None


class _Server:
    def __init__(self, control: socket.socket) -> None:
        self.control = control
        self.replies: dict[int, socket.socket] = {}  # child pid -> its reply socket
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        signal.set_wakeup_fd(self.wake_w.fileno())
        signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the selector
        self.selector = selectors.DefaultSelector()
        self.selector.register(control, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)

    def serve(self) -> int:
        while True:
            for key, _ in self.selector.select():
                if key.fileobj is self.wake_r:
                    while _drain(self.wake_r):
                        pass
                elif not self._handle_request():
                    return 0
            self._reap()

    def _handle_request(self) -> bool:
        """One request off the control channel; False at EOF."""
        try:
            data, ancillary, _, _ = self.control.recvmsg(
                MAX_MESSAGE, socket.CMSG_SPACE(FDS_PER_REQUEST * 4)
            )
        except ConnectionError:
            return False
        fds = _received_fds(ancillary)
        if not data and not fds:
            return False
        if len(fds) != FDS_PER_REQUEST:
            for fd in fds:
                os.close(fd)
            return True  # not a request this server speaks: nobody to answer
        reply = socket.socket(fileno=fds[0])
        try:
            self._fork(json.loads(data), reply, stderr_fd=fds[1], parent_fd=fds[2])
        except Exception as error:  # a refused or failed request; the server goes on
            _send(reply, {"error": f"{type(error).__name__}: {error}"})
            reply.close()
        finally:
            os.close(fds[1])
            os.close(fds[2])
        return True

    def _fork(self, request: dict, reply: socket.socket, *, stderr_fd: int, parent_fd: int):
        argv = [str(arg) for arg in request["argv"]]
        if argv[1:4] != ["-m", "sr", "worker"]:  # the same rule as sr.pool.forked.forkable
            raise ValueError(f"only `python -m sr worker` is forked, not {argv[1:4]}")
        model_server = bool(request.get("model_server"))
        if "--parent-fd" in argv and not model_server:
            argv[argv.index("--parent-fd") + 1] = str(parent_fd)
        threads = len(os.listdir("/proc/self/task"))
        if threads != 1:
            raise RuntimeError(f"{threads} threads run in the fork server; forking needs 1")
        gc.freeze()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            server_fds = [self.control.fileno(), self.wake_r.fileno(), self.wake_w.fileno()]
            server_fds += [self.selector.fileno(), reply.fileno()]
            server_fds += [s.fileno() for s in self.replies.values()]
            if model_server:
                _model_server(argv, request, stderr_fd=stderr_fd, control_fd=parent_fd,
                              close=server_fds)  # fmt: skip
            _child(request, argv, stderr_fd=stderr_fd, parent_fd=parent_fd, close=server_fds)
        try:  # before any reap: it names this child, never a reused pid
            pidfd = os.pidfd_open(pid)
        except OSError:
            os.kill(pid, signal.SIGKILL)  # unsupervisable: the router will spawn instead
            raise
        try:
            _send(reply, {"pid": pid}, fds=[pidfd])
        finally:
            os.close(pidfd)
        self.replies[pid] = reply

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            reply = self.replies.pop(pid, None)
            if reply is not None:
                _send(reply, {"returncode": os.waitstatus_to_exitcode(status)})
                reply.close()


def _child(request: dict, argv: list[str], *, stderr_fd: int, parent_fd: int, close: list[int]):
    """In the forked child: become a fresh `sr worker` process; never returns."""
    code = 1
    try:
        become_fresh(request, stderr_fd=stderr_fd, close=close)
        set_cmdline(argv)
        # `python -m sr worker ...` (checked in `_fork`): what sr.cli would run for it.
        from sr.worker.cli import main as worker_main

        sys.argv = [argv[0], *argv[3:]]
        code = _exit_code(worker_main, argv[4:])
    except KeyboardInterrupt:  # as an interpreter does: die of the signal
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _model_server(
    argv: list[str], request: dict, *, stderr_fd: int, control_fd: int, close: list[int]
):
    """In the forked child: become a deployment's fork server (module docstring); never
    returns."""
    code = 1
    try:
        become_fresh(request, stderr_fd=stderr_fd, close=close)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # as the router's server: ^C is not ours
        artifact = argv[argv.index("--artifact") + 1] if "--artifact" in argv else "?"
        set_cmdline([sys.executable, "-m", "sr.pool.forkserver", "--model", artifact])
        control = socket.socket(fileno=control_fd)
        try:
            from sr.worker.model_server import preload

            summary = preload(argv)
        except Exception as error:  # reported to the router, which forks without the model
            _send(control, {"error": f"{type(error).__name__}: {error}"})
        else:
            gc.freeze()
            _send(control, {"ready": True, "pid": os.getpid(), **summary})
            code = _Server(control).serve()
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stderr.flush()
        finally:
            os._exit(code)


def become_fresh(request: dict, *, stderr_fd: int, close: list[int]) -> None:
    """Leave the server's state behind in a forked child: what a new interpreter started
    with the request's environment, cwd and stderr would have (module docstring)."""
    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for fd in close:
        os.close(fd)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.dup2(stderr_fd, 2)
    os.close(devnull)
    os.close(stderr_fd)
    replace_process_environment(request.get("env") or {})
    if request.get("cwd"):
        os.chdir(request["cwd"])
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None and _fresh_torch_seed is not None:
        torch.default_generator.manual_seed(_fresh_torch_seed)
    threads = _fresh_torch_threads
    if torch is not None and threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)  # sets the count; no thread starts until one is used


_fresh_torch_seed: int | None = None
_fresh_torch_threads: int | None = None


def remember_fresh_state() -> None:
    """Call once torch is imported and before anything seeds it or sets its thread count:
    the seed a new process's torch generator has (torch's fixed default) and its default
    thread count, which `become_fresh` restores."""
    global _fresh_torch_seed, _fresh_torch_threads
    torch = sys.modules.get("torch")
    _fresh_torch_seed = None if torch is None else torch.initial_seed()
    _fresh_torch_threads = None if torch is None else torch.get_num_threads()


def _exit_code(main, args: list[str]) -> int:
    try:
        result = main(args)
    except SystemExit as leaving:
        result = leaving.code
    if result is None:
        return 0
    if isinstance(result, int):
        return result
    print(result, file=sys.stderr)  # SystemExit("message"), as the interpreter prints it
    return 1


def set_cmdline(argv: list[str]) -> bool:
    """Write `argv` over this process's original argv strings, so /proc/self/cmdline (and
    ps) show it; the rest of the area is zeroed. False (nothing written) if it does not fit.
    The area is our own stack: fields 48-49 of /proc/self/stat say where it lies."""
    with open("/proc/self/stat", "rb") as file:
        stat = file.read()
    fields = stat[stat.rindex(b")") + 2 :].split()  # field 3 onwards
    start, end = int(fields[45]), int(fields[46])
    text = b"\0".join(os.fsencode(arg) for arg in argv) + b"\0"
    if len(text) > end - start:
        return False
    ctypes.memmove(start, text + b"\0" * (end - start - len(text)), end - start)
    return True


def _send(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    try:
        sock.sendmsg([data], ancillary)
    except OSError:
        pass  # the router is gone or stopped listening for this child: nothing to tell


def _received_fds(ancillary) -> list[int]:
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    return list(fds)


def _drain(sock: socket.socket) -> bool:
    try:
        return bool(sock.recv(4096))
    except BlockingIOError:
        return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
