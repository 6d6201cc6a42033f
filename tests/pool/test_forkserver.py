"""Workers forked by the fork server (sr.pool.forked, sr.pool.forkserver): real processes,
tiny model. They answer, their exit status and reason reach the pool, SIGKILL restarts them,
they die with the router, and a dead or broken fork server never stops a replica starting."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sr.events import RecordingSink
from sr.pool import forked, open_router
from sr.pool import replica as replica_module
from tests.pool.test_pool_e2e import embed, rows, tiny_config, wait_until
from tests.serve_process import ServeProcess, pid_alive, serve_config, wait_gone

pytestmark = pytest.mark.e2e


def parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def cmdline(pid: int) -> list[str]:
    return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]


@pytest.fixture(autouse=True)
def _fork_start(monkeypatch):
    monkeypatch.setenv(forked.START_ENV, "fork")
    # As on a host where nobody caps threads: numpy's OpenBLAS would start a pool at import
    # in the server (sr.pool.forked.SERVER_ONLY_ENV keeps it at one thread).
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)


async def test_forked_workers_answer_restart_after_sigkill_and_leave_with_the_router(
    tiny_model_dir, tmp_path
):
    sink = RecordingSink()
    async with open_router(
        tiny_config(tiny_model_dir, 2), events=sink, threads=1, run_dir=tmp_path / "run"
    ) as core:
        await core.wait_ready(60)
        await wait_until(lambda: all(r.ready for r in rows(core)), 60)
        victim, survivor = rows(core)
        server = parent_of(victim.pid)
        # both forked by one fork server, not by us; each shows its own worker argv
        assert server != os.getpid() and parent_of(survivor.pid) == server
        assert "sr.pool.forkserver" in cmdline(server)
        argv = cmdline(victim.pid)
        assert argv[1:4] == ["-m", "sr", "worker"] and "--parent-fd" in argv
        assert Path(argv[argv.index("--uds") + 1]).parent == tmp_path / "run"
        assert {await embed(core), await embed(core)} == {victim.id, survivor.id}

        os.kill(victim.pid, signal.SIGKILL)
        await wait_until(lambda: rows(core)[0].state.value == "restarting", 5)
        assert rows(core)[0].reason.startswith("killed by SIGKILL; restarting in ")
        await wait_until(lambda: rows(core)[0].state.value == "ready", 30)
        restarted = rows(core)[0]
        assert restarted.restarts == 1 and restarted.pid not in (None, victim.pid)
        assert parent_of(restarted.pid) == server  # the same server forked it again
        assert rows(core)[1].pid == survivor.pid
        assert victim.id in {await embed(core) for _ in range(4)}
        workers = [restarted.pid, survivor.pid]
    assert wait_gone([*workers, server], 10) == []
    assert sink.named("fork_server_unavailable") == []


async def test_a_forked_workers_exit_code_and_last_line_make_the_reason(
    monkeypatch, tiny_model_dir, tmp_path
):
    real_argv = replica_module.worker_argv

    def bad_threads(*args, **kwargs):  # a real `sr worker` that refuses its arguments
        return [*real_argv(*args, **kwargs), "--threads", "0"]

    monkeypatch.setattr(replica_module, "worker_argv", bad_threads)
    async with open_router(
        tiny_config(tiny_model_dir, 1), threads=1, run_dir=tmp_path / "run"
    ) as core:
        await wait_until(lambda: rows(core)[0].state.value == "restarting", 60)
        reason = rows(core)[0].reason
    assert reason.startswith("exited 2: sr worker: "), reason
    assert "threads" in reason and reason.endswith("; restarting in 1s")


async def test_after_the_fork_server_dies_workers_serve_and_replicas_still_start(
    tiny_model_dir, tmp_path
):
    sink = RecordingSink()
    async with open_router(
        tiny_config(tiny_model_dir, 1), events=sink, threads=1, run_dir=tmp_path / "run"
    ) as core:
        await core.wait_ready(60)
        worker = rows(core)[0]
        server = parent_of(worker.pid)
        assert server != os.getpid(), "the worker was spawned, not forked"  # never kill us
        os.kill(server, signal.SIGKILL)
        assert wait_gone([server], 5) == []
        assert await embed(core) == worker.id  # its worker does not depend on it
        assert pid_alive(worker.pid)

        os.kill(worker.pid, signal.SIGKILL)
        await wait_until(lambda: rows(core)[0].state.value == "restarting", 5)
        # nobody is left to reap it and tell its status: said so, not guessed
        assert rows(core)[0].reason.startswith(
            "exited (exit status unknown: the fork server that started it is gone); "
        )
        await wait_until(lambda: rows(core)[0].state.value == "ready", 60)
        fresh = rows(core)[0]
        new_server = parent_of(fresh.pid)
        assert new_server not in (server, os.getpid())  # a new fork server forked it
        assert "sr.pool.forkserver" in cmdline(new_server)
        assert await embed(core) == worker.id
    assert sink.named("fork_server_unavailable") == []
    assert wait_gone([fresh.pid, new_server], 10) == []


async def test_a_fork_server_that_cannot_start_falls_back_to_spawn(
    monkeypatch, tiny_model_dir, tmp_path
):
    monkeypatch.setattr(forked, "SERVER_MODULE", "sr.pool.no_such_fork_server")
    sink = RecordingSink()
    async with open_router(
        tiny_config(tiny_model_dir, 1), events=sink, threads=1, run_dir=tmp_path / "run"
    ) as core:
        await core.wait_ready(60)
        worker = rows(core)[0]
        assert parent_of(worker.pid) == os.getpid()  # spawned by us, as without a server
        assert await embed(core) == worker.id
    [event] = sink.named("fork_server_unavailable")
    assert event["fallback"] == "spawn" and "did not start" in event["reason"]


def test_a_killed_router_takes_its_fork_server_and_forked_workers_with_it(tiny_model_dir, tmp_path):
    process = ServeProcess(
        tmp_path, serve_config(tiny_model_dir, 2), env={forked.START_ENV: "fork"}
    )
    process.start()
    try:
        workers = [row["pid"] for row in process.replicas()]
        servers = {parent_of(pid) for pid in workers}
        assert len(servers) == 1 and process.proc.pid not in servers
        process.signal(signal.SIGKILL)
        process.wait(10)
        assert wait_gone([*workers, *servers], 10) == []
    finally:
        process.stop()


@pytest.mark.parametrize(
    ("device", "value", "method", "warned"),
    [
        ("cpu", None, forked.DEFAULT_START, False),
        ("cpu", "spawn", "spawn", False),
        ("cpu", "fork", "fork", False),
        ("cuda:0", "fork", "spawn", False),  # GPU workers are always spawned
        ("cpu", "forkk", "spawn", True),
    ],
)
def test_start_method(device, value, method, warned):
    environ = {} if value is None else {forked.START_ENV: value}
    chosen, warning = forked.start_method(device, environ)
    assert chosen == method and (warning is not None) == warned
    if warned:
        assert "'forkk'" in warning and forked.START_ENV in warning


# A process that sets up state as the fork server does (^C ignored, a SIGCHLD handler, a
# wakeup fd, seeded random generators, an extra fd, torch at another thread count than its
# default, as a model's server loads at 1), forks, and reports from the child what
# `become_fresh` left: JSON on the child's new stderr.
FRESH_CHILD = """
import json, os, random, signal, socket, sys
import numpy, torch
from sr.pool.forkserver import become_fresh, remember_fresh_state, set_cmdline

remember_fresh_state()

signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGCHLD, lambda *_: None)
wake_r, wake_w = socket.socketpair()
wake_w.setblocking(False)
signal.set_wakeup_fd(wake_w.fileno())
server_fd = os.open(os.devnull, os.O_RDONLY)
report_r, report_w = os.pipe()
random.seed(7); numpy.random.seed(7)
fresh_torch = torch.rand(3).tolist()  # what a new process draws first
torch.manual_seed(7)
fresh_threads = torch.get_num_threads()
torch.set_num_threads(fresh_threads + 1)
pid = os.fork()
if pid == 0:
    random.seed(7); numpy.random.seed(7); torch.manual_seed(7)
    become_fresh({"env": {"ONLY": "this"}, "cwd": "/"}, stderr_fd=report_w,
                 close=[server_fd, report_r])
    fitted = set_cmdline([sys.executable, "-m", "sr", "worker", "--uds", "/x.sock"])
    sys.stderr.write(json.dumps({
        "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
        "sigchld": signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL,
        "wakeup": signal.set_wakeup_fd(-1),
        "random": random.random(), "numpy": float(numpy.random.random()),
        "torch": torch.rand(3).tolist(), "threads": torch.get_num_threads(),
        "env": dict(os.environ), "cwd": os.getcwd(),
        "stdin": os.readlink("/proc/self/fd/0"), "stdout": os.readlink("/proc/self/fd/1"),
        "server_fd_open": os.path.exists(f"/proc/self/fd/{server_fd}"),
        "fitted": fitted,
        "cmdline": open("/proc/self/cmdline", "rb").read().rstrip(b"\\0").decode(),
    }))
    sys.stderr.flush()
    os._exit(0)
os.close(report_w)
child = b"".join(iter(lambda: os.read(report_r, 65536), b""))
os.waitpid(pid, 0)
random.seed(7); numpy.random.seed(7)
print(json.dumps({"child": json.loads(child), "seeded_random": random.random(),
                  "seeded_numpy": float(numpy.random.random()), "fresh_torch": fresh_torch,
                  "fresh_threads": fresh_threads}))
"""


def test_a_forked_child_becomes_a_fresh_process():
    done = subprocess.run(
        [sys.executable, "-c", FRESH_CHILD],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    child = report["child"]
    assert child["sigint"] and child["sigchld"] and child["wakeup"] == -1
    # reseeded from the OS, not the parent's sequence; torch back to a new process's seed
    assert child["random"] != report["seeded_random"]
    assert child["numpy"] != report["seeded_numpy"]
    assert child["torch"] == report["fresh_torch"]
    assert child["threads"] == report["fresh_threads"]  # the default, not the server's
    assert child["env"] == {"ONLY": "this"} and child["cwd"] == "/"
    assert child["stdin"] == child["stdout"] == os.devnull
    assert not child["server_fd_open"]
    assert child["fitted"]
    assert child["cmdline"].split("\0") == [
        sys.executable,
        "-m",
        "sr",
        "worker",
        "--uds",
        "/x.sock",
    ]
