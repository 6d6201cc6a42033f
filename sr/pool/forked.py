"""The router's side of the fork server (sr.pool.forkserver): start it, fork workers through
it, and supervise a forked worker as if it were our own child.

Rules:
* Which start a managed replica gets: `SR_WORKER_START` = `fork` (CPU replicas through the
  fork server) or `spawn` (`python -m sr worker` started directly, as before); default in
  `DEFAULT_START`. GPU replicas are always spawned (see `start_method`).
* One fork server per run folder (one per router), shared by its replicas: each managed
  runner holds a lease (`lease_fork_server`) for as long as it runs; the last lease out
  closes the control channel and the server exits. It is started by the first worker
  start that needs it, or adopted then: `sr serve` starts it before the router's own code
  is imported (sr.pool.fork_start).
* A forked worker is not our child, so `ForkedWorker` gets from the server what waitpid
  would give: the exit status (`returncode`, negative for a signal). Signals go through the
  pidfd the server sent (pidfd_send_signal), which names that process and never a later
  one with the same pid. The worker still exits when the router dies: its `--parent-fd` is
  the router's pipe, handed through the server.
* A deployment's CPU replicas are forked by a fork server of their own (`ModelForkServer`),
  which the router's server forks and which loads the model before forking
  (sr.worker.model_server): their weights, packed ones included, are then shared pages. One
  per run folder and model (the worker argv less the flags that differ between replicas),
  leased like the router's: a reload that changes the model leases a new one, and the last
  replica of a retired deployment closes its own. If it cannot start or load, the replica
  is forked by the router's server as before and the log says why
  (`model_server_unavailable`); that failure is kept, so later restarts do not load again.
* If a server is gone (crashed, killed), the next worker start starts a new one; if that
  fails too, the worker is spawned directly and the log says so (`fork_server_unavailable`).
  Workers it forked keep running; when one of them exits, its status is unknown (the
  server that would have reaped it is gone): `returncode` stays None and `exit_note` says why.
"""

from __future__ import annotations

import array
import json
import os
import select
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from sr.events import EventSink
from sr.pool import fork_start
from sr.pool.fork_start import (  # noqa: F401 (START_ENV, DEFAULT_START, start_method: re-exported)
    DEFAULT_START,
    SERVER_MODULE,
    SERVER_ONLY_ENV,
    START_ENV,
    server_command,
    server_env,
    start_method,
)

# Not `from sr.pool.forkserver import ...`: that module is run as `python -m`, and importing
# it from here (sr.pool's package import) first would make runpy warn and run it twice.
MAX_MESSAGE = 1 << 20  # sr.pool.forkserver.MAX_MESSAGE
SERVER_READY_S = 120.0  # importing torch on a loaded host takes seconds, not minutes
MODEL_SERVER_READY_S = 600.0  # loading a large model at 1 thread may take minutes
SERVER_STOP_S = 5.0
REPLY_S = 30.0  # a fork answers in milliseconds; this only bounds a wedged server


class ForkServerError(Exception):
    """The fork server could not be started or did not fork (the message says why)."""


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

    def exited(self) -> bool:
        """Whether the process has exited, reported or not (its pidfd turns readable)."""
        return self._exited or bool(select.select([self._pidfd], [], [], 0)[0])

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


class ForkServer:
    """One `python -m sr.pool.forkserver` process and its control channel."""

    kind = "fork_server"  # in the event logged when it cannot fork: `<kind>_unavailable`

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.process: trio.Process | ForkedWorker | _EarlyServer | None = None
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
        return await self._fork({"argv": argv, "env": env}, parent_read)

    async def fork_model_server(
        self, argv: list[str], *, control: int, env: dict[str, str]
    ) -> ForkedWorker:
        """Fork a deployment's server for the model of `argv` (a worker's); `control` is its
        end of the control channel. Its stderr is ours, as this server's is."""
        request = {"argv": argv, "env": env, "model_server": True}
        return await self._fork(request, control, stderr=sys.stderr.fileno())

    async def _fork(
        self, request: dict, third_fd: int, *, stderr: int | None = None
    ) -> ForkedWorker:
        """Send one fork request (sr.pool.forkserver) and take the child's pid and pidfd;
        the child's stderr is `stderr`, or a new pipe we read when None."""
        err_read, err_write = os.pipe() if stderr is None else (-1, os.dup(stderr))
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        reply = trio.socket.from_stdlib_socket(mine)
        try:
            async with self._lock:
                if not self.running:
                    await self._start()
                request = {**request, "cwd": os.getcwd()}
                # the order sr.pool.forkserver expects: reply, stderr, parent-fd (or control)
                fds = array.array("i", [theirs.fileno(), err_write, third_fd])
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
            if err_read >= 0:
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
        stderr = trio.lowlevel.FdStream(err_read) if err_read >= 0 else None
        return ForkedWorker(int(answer["pid"]), fds[0], reply, stderr)

    async def _start(self) -> None:
        env = server_env(self.env)
        early = fork_start.take(SERVER_MODULE, env)  # `sr serve` may have started it already
        if early is not None:
            popen, mine = early
            self.process = _EarlyServer(popen)
        else:
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                self.process = await trio.lowlevel.open_process(
                    server_command(SERVER_MODULE, theirs.fileno()),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    env=env,
                    pass_fds=(theirs.fileno(),),
                )
            finally:
                theirs.close()
        self._control = trio.socket.from_stdlib_socket(mine)
        await self._wait_ready("fork server", SERVER_READY_S)

    async def _wait_ready(self, what: str, timeout_s: float) -> dict:
        """The server's ready message, or ForkServerError (the server closed) saying why."""
        answer: dict = {}
        with trio.move_on_after(timeout_s):
            data = await self._control.recv(MAX_MESSAGE)
            answer = json.loads(data) if data else {"error": "exited before it was ready"}
        if not answer.get("ready"):
            why = answer.get("error") or f"not ready within {timeout_s:g}s"
            await self.aclose()
            raise ForkServerError(f"{what} did not start: {why}")
        self.pid = int(answer["pid"])
        return answer

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


class _EarlyServer:
    """A fork server started before Trio ran (sr.pool.fork_start), as ForkServer uses the
    trio.Process it starts itself: its exit status, kill, and a wait."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self._popen = popen

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    def kill(self) -> None:
        if self._popen.poll() is None:
            self._popen.kill()

    async def wait(self) -> int:
        # A thread blocks in waitpid; a cancelled wait leaves it to end with the process.
        return await trio.to_thread.run_sync(self._popen.wait, abandon_on_cancel=True)


class ModelForkServer(ForkServer):
    """A deployment's fork server: forked by the router's (`base`), the model of the worker
    argv `model_argv` loaded before it forks (sr.worker.model_server)."""

    kind = "model_server"

    def __init__(
        self, base: ForkServer, model_argv: list[str], env: dict[str, str], events: EventSink
    ) -> None:
        super().__init__(env)
        self.base = base
        self.model_argv = model_argv
        self.events = events
        self.failure: str | None = None  # why it could not start; then it is not retried

    @property
    def running(self) -> bool:
        return self.process is not None and not self.process.exited()

    async def _start(self) -> None:
        if self.failure is not None:
            raise ForkServerError(self.failure)
        if self.process is not None:  # a server that died: reap its handle first
            await self.aclose()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            try:
                self.process = await self.base.fork_model_server(
                    self.model_argv, control=theirs.fileno(), env=self.env
                )
            finally:
                theirs.close()
            self._control = trio.socket.from_stdlib_socket(mine)
            ready = await self._wait_ready("the model's fork server", MODEL_SERVER_READY_S)
        except ForkServerError as error:
            mine.close()
            self.failure = str(error)
            raise
        argv = self.model_argv
        self.events.emit(
            "model_server_ready",
            server_pid=self.pid,
            artifact=argv[argv.index("--artifact") + 1],
            kernel=ready.get("kernel"),
            load_s=ready.get("load_s"),
        )


def model_key(argv: list[str]) -> tuple[str, ...]:
    """What makes two workers' models the same: their argv less the flags that differ
    between replicas of one deployment (socket, pipe, names, threads)."""
    per_replica = ("--uds", "--parent-fd", "--deployment", "--replica", "--threads")
    out: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg in per_replica:
            next(args, None)
        else:
            out.append(arg)
    return tuple(out)


# (run folder, model key or ()) -> (server, leases held)
_servers: dict[tuple[Path, tuple[str, ...]], tuple[ForkServer, int]] = {}


@asynccontextmanager
async def lease_fork_server(run_dir: Path, env: dict[str, str]) -> AsyncIterator[ForkServer]:
    """The run folder's fork server, shared; closed when its last lease is returned."""
    async with _lease((run_dir, ()), lambda: ForkServer(env)) as server:
        yield server


@asynccontextmanager
async def lease_model_server(
    run_dir: Path,
    base: ForkServer,
    worker_argv: list[str],
    env: dict[str, str],
    events: EventSink,
) -> AsyncIterator[ModelForkServer]:
    """The fork server for the model `worker_argv` serves, shared by the replicas of that
    model in this run folder; closed when its last lease is returned. Hold `base`'s lease
    around it. `events` hears when it is ready."""
    key = model_key(worker_argv)

    def new_server() -> ModelForkServer:
        return ModelForkServer(base, list(key), env, events)

    async with _lease((run_dir, key), new_server) as server:
        yield server


@asynccontextmanager
async def _lease(key, new_server):
    server, leases = _servers.get(key, (None, 0))
    if server is None:
        server = new_server()
    _servers[key] = (server, leases + 1)
    try:
        yield server
    finally:
        server, leases = _servers[key]
        if leases > 1:
            _servers[key] = (server, leases - 1)
        else:
            del _servers[key]
            with trio.CancelScope(shield=True):
                await server.aclose()


def forkable(argv: list[str]) -> bool:
    """Whether the fork server can run `argv`: it forks `python -m sr worker ...` only."""
    return argv[1:4] == ["-m", "sr", "worker"]
