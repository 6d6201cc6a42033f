"""`sr worker` API keys (sr.worker.auth): required off loopback, enforced on every route
but the probes, checked with a real HTTP client against a real worker process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest
from test_http_e2e import start_worker, stop

from sr.errors import UsageError
from sr.worker.auth import (
    ENV_VAR,
    WorkerKeyCheck,
    is_loopback_host,
    required_key_problem,
    worker_key,
)
from sr.worker.cli import parse_command

KEY = "s3cret-worker-key"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("127.255.0.9", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.0.0.5", False),
        ("192.168.1.2", False),
        ("fd00::1", False),
        ("worker-0.sr-workers", False),
    ],
)
def test_which_binds_are_loopback(host, loopback):
    assert is_loopback_host(host) is loopback
    assert (required_key_problem(host, None) is None) is loopback
    assert required_key_problem(host, KEY) is None


def test_a_non_loopback_bind_without_a_key_is_a_usage_error(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    for host in ("0.0.0.0", "::"):
        with pytest.raises(UsageError, match=f"--host {host} is reachable from other machines"):
            parse_command(["--artifact", "x", "--host", host, "--port", "8100"])
    command = parse_command(
        ["--artifact", "x", "--host", "0.0.0.0", "--port", "1", "--api-key", KEY]
    )
    assert command.api_key == KEY and KEY not in repr(command)
    monkeypatch.setenv(ENV_VAR, KEY)
    assert parse_command(["--artifact", "x", "--host", "::", "--port", "1"]).api_key == KEY


def test_the_environment_key_is_for_tcp_only(monkeypatch, tmp_path):
    # a managed worker inherits its router's environment; its router sends it no key
    monkeypatch.setenv(ENV_VAR, KEY)
    uds = str(tmp_path / "w.sock")
    assert parse_command(["--artifact", "x", "--uds", uds]).api_key is None
    assert parse_command(["--artifact", "x", "--uds", uds, "--api-key", KEY]).api_key == KEY
    assert parse_command(["--artifact", "x", "--port", "0"]).api_key == KEY


def test_keys_that_cannot_travel_in_a_header_are_refused():
    with pytest.raises(UsageError, match="--api-key: must not be empty"):
        worker_key("  ", {}, tcp=True)
    with pytest.raises(UsageError, match="printable ASCII"):
        worker_key("two words", {}, tcp=True)
    with pytest.raises(UsageError, match=f"{ENV_VAR}: must be printable ASCII"):
        worker_key(None, {ENV_VAR: "clé"}, tcp=True)
    assert worker_key(None, {ENV_VAR: " "}, tcp=True) is None


def test_the_check_opens_only_the_probes():
    check = WorkerKeyCheck(KEY)
    good = [(b"authorization", f"Bearer {KEY}".encode())]
    assert check.allows("/health", []) and check.allows("/health/live", [])
    assert check.allows("/v1/models", good)
    assert check.allows("/v1/embeddings", [(b"authorization", f"bearer  {KEY}".encode())])
    for headers in (
        [],
        [(b"authorization", KEY.encode())],
        [(b"authorization", f"Basic {KEY}".encode())],
        [(b"authorization", f"Bearer {KEY}x".encode())],
        [(b"authorization", b"Bearer ")],
    ):
        assert not check.allows("/v1/embeddings", headers)
    assert not check.allows("/metrics", []) and not check.allows("/health/", [])


def test_a_worker_off_loopback_without_a_key_exits_2_with_one_line():
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    argv = ["--artifact", "x", "--host", "0.0.0.0", "--port", "0"]
    proc = subprocess.run(
        [sys.executable, "-m", "sr", "worker", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith("sr worker: --host 0.0.0.0 is reachable from other machines")


@pytest.mark.e2e
def test_a_keyed_worker_answers_401_without_the_key(tiny_model_dir):
    proc = start_worker(
        ["--artifact", str(tiny_model_dir), "--host", "127.0.0.2", "--port", "0"],
        env={ENV_VAR: KEY},
    )
    try:
        port = json.loads(proc.stdout.readline())["port"]
        base = f"http://127.0.0.2:{port}"
        with httpx.Client(base_url=base, timeout=10) as anonymous:
            deadline = time.monotonic() + 30
            while anonymous.get("/health").status_code != 200:  # open without a key
                assert time.monotonic() < deadline, "worker did not become ready"
                time.sleep(0.1)
            assert anonymous.get("/health/live").status_code == 200
            for method, path in (
                ("GET", "/v1/models"),
                ("POST", "/v1/embeddings"),
                ("GET", "/metrics"),
            ):
                answer = anonymous.request(method, path, json={"input": "hi"})
                assert answer.status_code == 401, path
                assert answer.headers["www-authenticate"] == "Bearer"
                error = answer.json()["error"]
                assert error["code"] == "invalid_api_key"
                assert error["type"] == "invalid_request_error" and error["param"] is None
                assert KEY not in answer.text
            wrong = anonymous.get("/v1/models", headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401
        headers = {"Authorization": f"Bearer {KEY}"}
        with httpx.Client(base_url=base, timeout=10, headers=headers) as keyed:
            assert keyed.get("/v1/models").status_code == 200
            answer = keyed.post("/v1/embeddings", json={"input": ["a", "b"]})
            assert answer.status_code == 200 and len(answer.json()["data"]) == 2
    finally:
        stop(proc)
    assert KEY not in proc.stderr.read()  # never logged
