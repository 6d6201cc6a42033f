"""`python -m sr worker` as a real process: UDS and TCP, health, garbage, signals, exit fault."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time

import httpx
import pytest

pytestmark = pytest.mark.e2e
READY_TIMEOUT_S = 20


def start_worker(args: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "sr", "worker", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
        text=True,
    )


def wait_ready(client: httpx.Client, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        try:
            if client.get("/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError("worker did not become ready")


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
        raise


def test_uds_worker_serves_survives_garbage_and_stops_on_sigterm(tmp_path, tiny_model_dir):
    folder = tmp_path / "sockets"
    folder.mkdir()
    folder.chmod(0o700)  # an existing folder must already be private; it is never chmodded
    path = folder / "w.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))  # a socket file nobody listens on: what a killed worker leaves
    stale.close()
    proc = start_worker(["--artifact", str(tiny_model_dir), "--uds", str(path)])
    transport = httpx.HTTPTransport(uds=str(path))
    try:
        with httpx.Client(transport=transport, base_url="http://worker", timeout=10) as client:
            wait_ready(client, proc)
            assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
            answer = client.post("/v1/embeddings", json={"input": ["hello", "world"]})
            assert answer.status_code == 200 and len(answer.json()["data"]) == 2
            for garbage in (b"\xff\xfe", b"[" * 50_000, b'{"input": {"deep": [[[1]]]}}', b""):
                reply = client.post("/v1/embeddings", content=garbage)
                assert reply.status_code == 400, reply.text
                assert reply.json()["error"]["code"] == "invalid_request"
            big = client.post("/v1/embeddings", content=b" " * (5 * 1024 * 1024))
            assert big.status_code == 413
            assert client.get("/nope").status_code == 404
            assert client.post("/admin/faults", json={"mode": "exit"}).status_code == 404
            card = client.get("/v1/models").json()["data"][0]
            assert card["golden"]["status"] == "passed" and card["state"] == "ready"
            assert client.get("/health/live").status_code == 200
            assert b"sr_worker_forwards_total" in client.get("/metrics").content
        assert stop(proc) == 0
        assert not path.exists()
        logs = [json.loads(line) for line in proc.stderr.read().splitlines() if line]
        assert any(entry.get("event") == "worker_stopping" for entry in logs)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_tcp_port_zero_prints_the_port_and_exit_fault_kills_the_process(tiny_model_dir):
    proc = start_worker(
        ["--artifact", str(tiny_model_dir), "--port", "0"], env={"SR_FAULT_INJECTION": "1"}
    )
    try:
        listening = json.loads(proc.stdout.readline())
        assert listening["listening"].startswith("http://127.0.0.1:")
        base = f"http://127.0.0.1:{listening['port']}"
        with httpx.Client(base_url=base, timeout=10) as client:
            wait_ready(client, proc)
            assert client.get("/admin/faults").json() == {"mode": "none", "slow_ms": 0}
            assert client.post("/admin/faults", json={"mode": "exit"}).json()["mode"] == "exit"
        assert proc.wait(timeout=10) == 1
    finally:
        if proc.poll() is None:
            proc.kill()


def test_usage_errors_exit_2_with_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "sr", "worker", "--artifact", "x"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--uds" in proc.stderr


def run_worker_until_exit(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sr", "worker", *args],
        capture_output=True,
        text=True,
        timeout=20,
    )


def test_a_port_in_use_exits_1_with_one_line_naming_the_bind(tiny_model_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = run_worker_until_exit(["--artifact", str(tiny_model_dir), "--port", str(port)])
    assert proc.returncode == 1
    failures = [line for line in proc.stderr.splitlines() if not line.startswith("{")]
    assert failures == [f"sr worker: cannot listen on 127.0.0.1:{port}: Address already in use"]
    assert proc.stdout == ""  # never claimed to be listening


def test_a_shared_socket_folder_exits_2_and_keeps_its_mode(tmp_path, tiny_model_dir):
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o755)
    proc = run_worker_until_exit(
        ["--artifact", str(tiny_model_dir), "--uds", str(folder / "w.sock")]
    )
    assert proc.returncode == 2
    failures = [line for line in proc.stderr.splitlines() if not line.startswith("{")]
    assert failures == [
        f"sr worker: --uds: the socket folder {folder} is shared (mode 755); use a private folder"
    ]
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o755
