"""The fork server's early start (sr.pool.fork_start): started before `sr serve` reads its
config and kept only for a config that forks a worker, adopted only with the module and
environment the pool would use, and never left running when nobody adopts it."""

from __future__ import annotations

import subprocess

import pytest

from sr import cli
from sr.config.schema import Deployment, Replica, SrConfig
from sr.errors import UsageError
from sr.pool import fork_start


def _config(*replicas: Replica) -> SrConfig:
    config = SrConfig()
    config.deployments["primary"] = Deployment(artifact="org/m", replicas=list(replicas))
    return config


@pytest.fixture(autouse=True)
def nothing_left():
    yield
    fork_start.discard()


def test_only_a_config_with_a_cpu_replica_to_fork_starts_one():
    cpu, gpu = Replica(device="cpu"), Replica(device="cuda:0")
    attached = Replica(endpoint="http://127.0.0.2:9000", model="org/m")
    assert fork_start.forks_a_worker(_config(cpu), {})
    assert fork_start.forks_a_worker(_config(gpu, cpu), {})
    assert not fork_start.forks_a_worker(_config(gpu), {})
    assert not fork_start.forks_a_worker(_config(attached), {})
    assert not fork_start.forks_a_worker(_config(cpu), {fork_start.START_ENV: "spawn"})
    fork_start.prestart(_config(gpu), {})
    assert fork_start.take(fork_start.SERVER_MODULE, {}) is None


def test_a_server_with_another_environment_is_killed_not_adopted():
    environ = {"PATH": "/usr/bin:/bin"}
    fork_start.prestart(_config(Replica(device="cpu")), environ)
    early = fork_start._prestarted
    assert early is not None and early.process.poll() is None
    other = fork_start.server_env(fork_start.worker_env({**environ, "OMP_NUM_THREADS": "1"}))
    assert fork_start.take(fork_start.SERVER_MODULE, other) is None
    assert early.process.poll() is not None  # killed at once: it had forked nothing
    assert fork_start._prestarted is None


def test_the_server_the_pool_would_start_is_adopted_and_serves():
    environ = {"PATH": "/usr/bin:/bin"}
    fork_start.prestart(_config(Replica(device="cpu")), environ)
    env = fork_start.server_env(fork_start.worker_env(environ))
    assert fork_start.take("sr.pool.another_module", env) is None  # another module: killed
    fork_start.prestart(_config(Replica(device="cpu")), environ)
    taken = fork_start.take(fork_start.SERVER_MODULE, env)
    assert taken is not None
    process, control = taken
    try:
        control.settimeout(60)
        ready = control.recv(4096)  # the fork server's first message, once torch is in
        assert b'"ready": true' in ready, ready
    finally:
        control.close()  # end of its control channel: it exits
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    assert fork_start.take(fork_start.SERVER_MODULE, env) is None  # taken once only


def _early_process() -> subprocess.Popen | None:
    early = fork_start._prestarted
    return None if early is None else early.process


def test_sr_serve_starts_one_before_its_config_and_the_config_decides_whether_it_stays():
    environ = {"PATH": "/usr/bin:/bin"}
    fork_start.start_early(["--model", "org/m"], environ)
    early = _early_process()
    assert early is not None and early.poll() is None
    fork_start.prestart(_config(Replica(device="cpu")), environ)
    assert _early_process() is early  # the pool's environment: kept, not started again
    fork_start.prestart(_config(Replica(device="cuda:0")), environ)
    assert _early_process() is None  # a config that forks nothing: killed at once
    assert early.wait(timeout=10) is not None


def test_an_early_server_with_another_environment_is_replaced():
    fork_start.start_early([], {"PATH": "/usr/bin:/bin"})
    early = _early_process()
    fork_start.prestart(_config(Replica(device="cpu")), {"PATH": "/bin"})
    assert early is not None and early.wait(timeout=10) is not None
    started = fork_start._prestarted
    assert started is not None and started.env["PATH"] == "/bin"


@pytest.mark.parametrize(
    ("argv", "environ"),
    [
        (["--dry-run"], {}),
        (["--help"], {}),
        (["--model", "org/m"], {fork_start.START_ENV: "spawn"}),
    ],
)
def test_no_early_server_where_none_would_serve(argv, environ):
    fork_start.start_early(argv, {"PATH": "/usr/bin:/bin", **environ})
    assert _early_process() is None


def test_a_malformed_variable_starts_nothing():
    with pytest.raises(UsageError):
        fork_start.start_early([], {"VLLM_SRUN_CPU_ADAPTIVE_THREADS": "7"})
    assert _early_process() is None


def test_sr_serve_that_ends_in_a_usage_error_leaves_no_server(monkeypatch, capsys):
    started: list[subprocess.Popen] = []
    start = fork_start._start

    def recording_start(env):
        start(env)
        started.append(_early_process())

    monkeypatch.setattr(fork_start, "_start", recording_start)
    assert cli.main(["serve", "--no-such-flag"]) == 2
    assert "--no-such-flag" in capsys.readouterr().err
    assert len(started) == 1 and started[0] is not None
    assert started[0].poll() is not None  # killed and reaped before sr serve returned
    assert _early_process() is None
