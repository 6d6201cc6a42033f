"""SIGHUP scales without restarting surviving workers; SIGINT leaves no worker behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import yaml

from tests.serve_process import REPO_ROOT, ServeProcess, pid_alive, serve_config, wait_gone

pytestmark = pytest.mark.e2e


def test_sighup_scales_2_to_3_then_sigint_stops_every_worker(tmp_path, tiny_model_dir):
    router = ServeProcess(tmp_path, serve_config(tiny_model_dir, 2))
    router.start(timeout_s=40)
    try:
        before = {r["id"]: r["pid"] for r in router.replicas()}
        assert len(before) == 2
        router.configure(serve_config(tiny_model_dir, 3))
        router.signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            replicas = router.replicas()
            if len(replicas) == 3 and all(r["state"] == "ready" for r in replicas):
                break
            time.sleep(0.1)
        after = {r["id"]: r["pid"] for r in router.replicas()}
        assert len(after) == 3, router.logs()
        assert {k: after[k] for k in before} == before  # same identities, same processes
        assert all(pid_alive(pid) for pid in after.values())
        assert "config reloaded (primary=3)" in router.stdout_text()

        router.signal(signal.SIGINT)
        assert router.wait(30) == 0, router.logs()
        assert not wait_gone(after.values(), 5)
    finally:
        router.stop()


def test_startup_failure_is_one_line_exit_1(tmp_path):
    router = ServeProcess(tmp_path, serve_config(tmp_path / "no-such-model", 1))
    command_started = time.monotonic()
    try:
        router.start(timeout_s=30)
    except AssertionError:
        pass
    assert router.wait(30) == 1
    assert time.monotonic() - command_started < 30
    err = router.stderr_text().strip().splitlines()
    assert err[-1].startswith("sr serve: startup failed:")
    assert "no-such-model" in err[-1] and "Traceback" not in "\n".join(err)
    router.stop()


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("VLLM_SRUN_CPU_THREADS", "abc"),
        ("VLLM_SRUN_CPU_ADAPTIVE_THREADS", "7"),
        ("VLLM_SRUN_RESULT_CACHE", "lots"),
        ("VLLM_SRUN_READY_TIMEOUT", "soon"),
    ],
)
def test_bad_settings_stop_sr_serve_before_any_worker_with_exit_2(tmp_path, variable, value):
    router = ServeProcess(
        tmp_path, serve_config(tmp_path / "no-such-model", 1), env={variable: value}
    )
    try:
        router.start(timeout_s=20)
    except AssertionError:
        pass
    assert router.wait(20) == 2
    out = router.stdout_text()
    assert "replica" not in out  # refused before any worker was started
    err = router.stderr_text().strip().splitlines()
    assert err[-1].startswith(f"sr serve: error: {variable}")
    assert value in err[-1] and "Traceback" not in "\n".join(err)
    router.stop()


@pytest.mark.parametrize(
    ("flags", "address", "cause"),
    [
        ("taken", "127.0.0.1:{port}", "Address already in use"),
        (["--host", "no-such-host.invalid"], "no-such-host.invalid:0", "Name or service not known"),
        (["--host", "192.0.2.1"], "192.0.2.1:0", "Cannot assign requested address"),
    ],
    ids=["port taken", "host does not resolve", "address not on this host"],
)
def test_a_listener_that_cannot_bind_is_one_line_exit_1_before_any_worker(
    tmp_path, tiny_model_dir, flags, address, cause
):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(serve_config(tiny_model_dir, 2)))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        extra = ["--port", str(port)] if flags == "taken" else [*flags, "--port", "0"]
        done = subprocess.run(
            [sys.executable, "-m", "sr", "serve", "--config", str(config), *extra],
            capture_output=True, text=True, timeout=60, cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )  # fmt: skip
    assert done.returncode == 1
    # One line and nothing else: no traceback, and no worker started (a started pool
    # would have logged its replicas' states on stderr and printed to stdout).
    line = f"sr serve: startup failed: cannot listen on {address.format(port=port)}: {cause}"
    assert done.stderr == line + "\n"
    assert done.stdout == ""
