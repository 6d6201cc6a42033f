"""The fork server's early start (sr.pool.fork_start): started only for a config that forks
a worker, adopted only with the module and environment the pool would use, and never left
running when nobody adopts it."""

from __future__ import annotations

import subprocess

import pytest

from sr.config.schema import Deployment, Replica, SrConfig
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
