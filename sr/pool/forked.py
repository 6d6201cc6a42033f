"""The router's side of the fork server (sr.pool.forkserver): start it, fork workers through
it, and supervise a forked worker as if it were our own child.

Rules:
* Which start a managed replica gets: `SR_WORKER_START` = `fork` (CPU replicas through the
  fork server) or `spawn` (`python -m sr worker` started directly, as before); default in
  `DEFAULT_START`. GPU replicas are always spawned (see `start_method`).
* One fork server per run folder (one per router), shared by its replicas: each managed
  runner holds a lease (`lease_fork_server`) for as long as it runs; the last lease out
  closes the control channel and the server exits. It is started lazily, by the first
  worker start that needs it.
* A forked worker is not our child, so `ForkedWorker` gets from the server what waitpid
  would give: the exit status (`returncode`, negative for a signal). Signals go through the
  pidfd the server sent (pidfd_send_signal), which names that process and never a later
  one with the same pid. The worker still exits when the router dies: its `--parent-fd` is
  the router's pipe, handed through the server.
* If the server is gone (crashed, killed), the next worker start starts a new one; if that
  fails too, the worker is spawned directly and the log says so (`fork_server_unavailable`).
  Workers it forked keep running; when one of them exits, its status is unknown (the
  server that would have reaped it is gone): `returncode` stays None and `exit_note` says why.
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

# Not `from sr.pool.forkserver import ...`: that module is run as `python -m`, and importing
# it from here (sr.pool's package import) first would make runpy warn and run it twice.
MAX_MESSAGE = 1 << 20  # sr.pool.forkserver.MAX_MESSAGE
CMDLINE_ROOM = 4096  # sr.pool.forkserver.CMDLINE_ROOM

START_ENV = "SR_WORKER_START"
START_METHODS = ("fork", "spawn")
DEFAULT_START = "fork"
SERVER_MODULE = "sr.pool.forkserver"
SERVER_READY_S = 120.0  # importing torch on a loaded host takes seconds, not minutes
SERVER_STOP_S = 5.0
REPLY_S = 30.0  # a fork answers in milliseconds; this only bounds a wedged server


class ForkServerError(Exception):
    """The fork server could not be started or did not fork (the message says why)."""


def start_method(device: str, environ: dict[str, str]) -> tuple[str, str | None]:
    """(`fork` or `spawn`, a warning or None) for a managed worker on `device`.

    GPU workers are spawned: forking before CUDA is initialised would be safe, but each GPU
    worker's host memory is small beside its device memory, and a GPU driver stack (CUDA,
    ROCm, their versions) is more than this host can test."""
    wanted = environ.get(START_ENV, DEFAULT_START)
    warning = None
    if wanted not in START_METHODS:
        warning = f"{START_ENV}={wanted!r} is not one of {', '.join(START_METHODS)}; using spawn"
        wanted = "spawn"
    if device != "cpu":
        return "spawn", warning
    return wanted, warning


class ForkedWorker:
    """A worker forked by the server, with the part of trio.Process's shape the runner uses."""

    def __init__(self, pid: int, pidfd: int, reply: trio.socket.SocketType, stderr) -> None:
        self.pid = pid
        self.stderr = stderr
        self.returncode: int | None = None
        self.exit_note = ""  # why returncode is None after the exit, when it is
        self._pidfd = pidfd
        self._reply = reply
        self._exited = False
        self._lock = trio.Lock()

    async def wait(self) -> int | None:
        async with self._lock:  # one reader at a time; a cancelled wait loses nothing
            if not self._exited:
                await self._read_exit()
        return self.returncode

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self._exited:
            return
        try:
            signal.pidfd_send_signal(self._pidfd, signum)
        except ProcessLookupError:
            pass  # exited, not yet reported

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    async def _read_exit(self) -> None:
        try:
            data = await self._reply.recv(MAX_MESSAGE)
        except OSError:
            data = b""
        message = json.loads(data) if data else {}
        if "returncode" in message:
            self.returncode = int(message["returncode"])
        else:  # the server died: only the kernel can still say when the worker ends
            await trio.lowlevel.wait_readable(self._pidfd)
            self.exit_note = "exit status unknown: the fork server that started it is gone"
        self._exited = True
        self._reply.close()
        os.close(self._pidfd)


# The server forks only while it has one thread, but numpy's OpenBLAS (imported by torch)
# starts a pool of cores - 1 threads at import unless told otherwise. Workers never use
# numpy's BLAS for their arithmetic (torch's kernels do it), so the server and the workers
# it forks run OpenBLAS at one thread; the workers' own environment is the request's.
SERVER_ONLY_ENV = {"OPENBLAS_NUM_THREADS": "1"}


class ForkServer:
    """One `python -m sr.pool.forkserver` process and its control channel."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.process: trio.Process | None = None
        self.pid: int | None = None
        self._control: trio.socket.SocketType | None = None
        self._lock = trio.Lock()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def fork_worker(
        self, argv: list[str], *, parent_read: int, env: dict[str, str]
    ) -> ForkedWorker:
        """Fork `python -m sr worker ...` (`argv`); its stderr is a new pipe we read."""
        err_read, err_write = os.pipe()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        reply = trio.socket.from_stdlib_socket(mine)
        try:
            async with self._lock:
                if not self.running:
                    await self._start()
                request = {"argv": argv, "env": env, "cwd": os.getcwd()}
                # the order sr.pool.forkserver expects: reply, stderr, parent-fd
                fds = array.array("i", [theirs.fileno(), err_write, parent_read])
                try:
                    await self._control.sendmsg(
                        [json.dumps(request).encode()],
                        [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)],
                    )
                except OSError as error:
                    raise ForkServerError(f"fork server gone: {error}") from None
            theirs.close()
            os.close(err_write)
            err_write = -1
            with trio.move_on_after(REPLY_S):
                data, ancillary, _, _ = await reply.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(4))
                return self._started(data, ancillary, reply, err_read)
            # A wedged server must not fork this worker later, beside the one spawned instead.
            self.process.kill()
            raise ForkServerError(f"fork server did not answer within {REPLY_S:g}s")
        except BaseException:
            reply.close()
            theirs.close()
            os.close(err_read)
            if err_write >= 0:
                os.close(err_write)
            raise

    def _started(self, data: bytes, ancillary, reply, err_read: int) -> ForkedWorker:
        fds = array.array("i")
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        answer = json.loads(data) if data else {"error": "fork server gone"}
        if "pid" not in answer or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise ForkServerError(str(answer.get("error", answer)))
        stderr = trio.lowlevel.FdStream(err_read)
        return ForkedWorker(int(answer["pid"]), fds[0], reply, stderr)

    async def _start(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [sys.executable, "-m", SERVER_MODULE, "--control-fd", str(theirs.fileno())]
        argv += ["--cmdline-room", "." * CMDLINE_ROOM]
        try:
            self.process = await trio.lowlevel.open_process(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env={**self.env, **SERVER_ONLY_ENV},
                pass_fds=(theirs.fileno(),),
            )
        finally:
            theirs.close()
        self._control = trio.socket.from_stdlib_socket(mine)
        answer: dict = {}
        with trio.move_on_after(SERVER_READY_S):
            data = await self._control.recv(MAX_MESSAGE)
            answer = json.loads(data) if data else {"error": "exited before it was ready"}
        if not answer.get("ready"):
            why = answer.get("error") or f"not ready within {SERVER_READY_S:g}s"
            await self.aclose()
            raise ForkServerError(f"fork server did not start: {why}")
        self.pid = int(answer["pid"])

    async def aclose(self) -> None:
        """Close the control channel (the server exits at EOF); SIGKILL if it lingers."""
        if self._control is not None:
            self._control.close()
            self._control = None
        if self.process is not None:
            with trio.move_on_after(SERVER_STOP_S):
                await self.process.wait()
            if self.process.returncode is None:
                self.process.kill()
                await self.process.wait()


_servers: dict[Path, tuple[ForkServer, int]] = {}  # run folder -> (server, leases held)


@asynccontextmanager
async def lease_fork_server(run_dir: Path, env: dict[str, str]) -> AsyncIterator[ForkServer]:
    """The run folder's fork server, shared; closed when its last lease is returned."""
    server, leases = _servers.get(run_dir, (None, 0))
    if server is None:
        server = ForkServer(env)
    _servers[run_dir] = (server, leases + 1)
    try:
        yield server
    finally:
        server, leases = _servers[run_dir]
        if leases > 1:
            _servers[run_dir] = (server, leases - 1)
        else:
            del _servers[run_dir]
            with trio.CancelScope(shield=True):
                await server.aclose()


def forkable(argv: list[str]) -> bool:
    """Whether the fork server can run `argv`: it forks `python -m sr worker ...` only."""
    return argv[1:4] == ["-m", "sr", "worker"]
