"""SIGHUP scales without restarting surviving workers; SIGINT leaves no worker behind."""

from __future__ import annotations

import signal
import time

import pytest

from tests.serve_process import ServeProcess, pid_alive, serve_config, wait_gone

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
