"""How a managed worker starts, the environment it starts with, and the fork server's early start.

Light on purpose (no trio, nothing else of the pool): `sr serve` calls it before it imports
the router's own code.

* `start_method`: `SR_WORKER_START` = `fork` (CPU replicas through the fork server,
  sr.pool.forked) or `spawn` (`python -m sr worker` started directly); GPU replicas are
  always spawned.
* `worker_env`: the environment a worker, or the fork server, starts with.
* Early start: the fork server spends one to three seconds importing torch before it can
  fork anything, and the router spends a third of one importing its own code, reading its
  config and binding its listener first. `start_early(argv, environ)`, `sr serve`'s first
  step (sr.cli), starts the server before any of that, on the guess that the config forks
  a CPU worker (the embedded default does); `prestart(config, environ)`, once the config
  is read, keeps it only if the config does and with the environment the pool would give
  it, else closes it and starts one when the config forks a worker. The pool's first fork
  (sr.pool.forked.ForkServer) adopts that server when its module and environment are the
  ones it would have started (`take`), and a server nobody adopted is closed by
  `discard`. Anything unexpected leaves the pool to start its own, as it always did.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sr.thread_budget import adaptive_mode

if TYPE_CHECKING:
    from sr.config.schema import SrConfig

START_ENV = "SR_WORKER_START"
START_METHODS = ("fork", "spawn")
DEFAULT_START = "fork"
SERVER_MODULE = "sr.pool.forkserver"
CMDLINE_ROOM = 4096  # sr.pool.forkserver.CMDLINE_ROOM
# The server forks only while it has one thread, but numpy's OpenBLAS (imported by torch)
# starts a pool of cores - 1 threads at import unless told otherwise. Workers never use
# numpy's BLAS for their arithmetic (torch's kernels do it), so the server and the workers
# it forks run OpenBLAS at one thread; the workers' own environment is the request's.
SERVER_ONLY_ENV = {"OPENBLAS_NUM_THREADS": "1"}
# libgomp spins before a waiting thread sleeps (worker_env): 20000 where workers yield
# threads on a loaded host (sr.worker.contention), 1000 where an adaptive learner chooses
# the counts and nothing yields (docs/decisions.md, "libgomp's spin count").
WORKER_SPIN_COUNT = 20000
LEARNING_SPIN_COUNT = 1000


def start_method(device: str, environ: Mapping[str, str]) -> tuple[str, str | None]:
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


def worker_env(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` (the settings' snapshot of ours), with this `sr` importable by `python -m
    sr` from any directory (an embedding program may run from a checkout that is not
    installed)."""
    env = dict(environ)
    root = str(Path(__file__).resolve().parents[2])
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        env["PYTHONPATH"] = os.pathsep.join([root, *paths])
    # GNU OpenMP spins 300k times for a peer thread before sleeping: on a loaded host a
    # peer that shares its core turns every operator of a multi-thread forward into
    # milliseconds of spinning; at 1000 spins a quiet host's forward after an idle pause
    # runs at one core's pace, its peer asleep between operators. 20000 spins keep the
    # quiet host fast where a worker on a loaded host yields threads instead; learning
    # workers do not yield and keep 1000. Read once when torch loads, so it must be in the
    # environment the worker (or the fork server) starts with; an operator's value wins.
    learning = adaptive_mode(env) != 0  # validated by sr.settings before any worker starts
    env.setdefault("GOMP_SPINCOUNT", str(LEARNING_SPIN_COUNT if learning else WORKER_SPIN_COUNT))
    return env


def server_env(env: Mapping[str, str]) -> dict[str, str]:
    """The fork server's environment, from the workers' (`worker_env`)."""
    return {**env, **SERVER_ONLY_ENV}


def server_command(module: str, control_fd: int) -> list[str]:
    """`python -m MODULE` as the fork server, its control channel on `control_fd`."""
    return [sys.executable, "-m", module, "--control-fd", str(control_fd),
            "--cmdline-room", "." * CMDLINE_ROOM]  # fmt: skip


def forks_a_worker(config: SrConfig, environ: Mapping[str, str]) -> bool:
    """Whether a managed replica of `config` would be forked."""
    return any(
        replica.device is not None
        and not replica.attached
        and start_method(replica.device, environ)[0] == "fork"
        for deployment in config.deployments.values()
        for replica in deployment.placements()
    )


class _Prestarted:
    __slots__ = ("control", "env", "module", "process")

    def __init__(self, process: subprocess.Popen, control: socket.socket, module: str,
                 env: dict[str, str]) -> None:  # fmt: skip
        self.process = process
        self.control = control  # our end of its control channel
        self.module = module
        self.env = env


_prestarted: _Prestarted | None = None


# `sr serve` flags that start no server: the early start would only be killed again.
_NO_SERVER_FLAGS = frozenset({"-h", "--help", "--dry-run"})


def start_early(argv: Sequence[str], environ: Mapping[str, str]) -> None:
    """Start the fork server before `sr serve` (its arguments `argv`) reads its config,
    unless CPU workers are spawned here or `argv` asks for no server (see the module)."""
    if _prestarted is not None or _NO_SERVER_FLAGS.intersection(argv):
        return
    if start_method("cpu", environ)[0] == "fork":
        _start(server_env(worker_env(environ)))  # UsageError: a malformed variable


def prestart(config: SrConfig, environ: Mapping[str, str]) -> None:
    """Have the fork server started if `config` has a CPU replica to fork, and only then
    (see the module): an early one is kept if its environment is the pool's."""
    if not forks_a_worker(config, environ):
        discard()
        return
    env = server_env(worker_env(environ))
    if _prestarted is not None:
        if _prestarted.env == env:
            return
        discard()
    _start(env)


def _start(env: dict[str, str]) -> None:
    global _prestarted
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        process = subprocess.Popen(
            server_command(SERVER_MODULE, theirs.fileno()), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, env=env, pass_fds=(theirs.fileno(),),
        )  # fmt: skip
    except OSError:
        mine.close()  # the pool starts its own, and says why if it cannot
        return
    finally:
        theirs.close()
    _prestarted = _Prestarted(process, mine, SERVER_MODULE, env)


def take(module: str, env: Mapping[str, str]) -> tuple[subprocess.Popen, socket.socket] | None:
    """The early server and our end of its control channel, if one runs `module` with
    `env` (what the caller would start); None otherwise (one that differs is closed)."""
    global _prestarted
    early, _prestarted = _prestarted, None
    if early is None:
        return None
    if early.module == module and early.env == dict(env) and early.process.poll() is None:
        return early.process, early.control
    _close(early)
    return None


def discard() -> None:
    """Stop an early server nobody adopted."""
    global _prestarted
    early, _prestarted = _prestarted, None
    if early is not None:
        _close(early)


def _close(early: _Prestarted) -> None:
    # Killed, not asked: it has forked nothing (nobody sent it a request), and it reads
    # its control channel only once torch is imported, a second later.
    early.control.close()
    early.process.kill()
    early.process.wait()
