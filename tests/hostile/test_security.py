"""The security points of docs/security.md, each backed by a check against real processes
or the code path that enforces it."""

from __future__ import annotations

import hmac
import os
import socket
import stat
import sys
from pathlib import Path

import httpx
import pytest

from sr.config.schema import Deployment, Listener
from sr.pool.replica import worker_argv
from sr.router.auth import OPEN_PATHS, ApiKeyCheck
from sr.router.serve import ROUTER_HTTP_LIMITS
from sr.worker.cli import parse_args
from tests.hostile.conftest import API_KEY
from tests.hostile.strategies import ROUTER_GET, ROUTER_POST
from tests.serve_process import worker_socket


# -- what listens where --------------------------------------------------------------------
def test_managed_worker_socket_lives_in_a_private_0700_directory(hostile_router):
    (pid,) = hostile_router.initial_pids
    path = Path(worker_socket(pid))
    assert stat.S_ISSOCK(path.lstat().st_mode)
    folder = path.parent.stat()
    assert stat.S_IMODE(folder.st_mode) == 0o700
    assert folder.st_uid == os.getuid()


def test_managed_worker_has_no_tcp_listener(hostile_router):
    (pid,) = hostile_router.initial_pids
    inodes = {
        os.readlink(f"/proc/{pid}/fd/{fd}")
        for fd in os.listdir(f"/proc/{pid}/fd")
        if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    }
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # TCP_LISTEN
                listening.add(f"socket:[{fields[9]}]")
    assert not inodes & listening, "a managed worker must only listen on its Unix socket"


def test_standalone_worker_and_router_default_to_loopback():
    _, listen = parse_args(["--artifact", "x", "--port", "0"])
    assert listen == {"host": "127.0.0.1", "port": 0}
    assert Listener().host == "127.0.0.1"


def test_router_listens_on_loopback_only(hostile_router):
    assert hostile_router.url.startswith("http://127.0.0.1:")
    other = _non_loopback_address()
    if other is None:
        pytest.skip("this host has no non-loopback address to try")
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://{other}:{hostile_router.port}/health", timeout=2)


def _non_loopback_address() -> str | None:
    """This host's address on its default route (no packet is sent), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") or address == "0.0.0.0" else address


# -- API keys ------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ROUTER_GET + ROUTER_POST + ["/api/v1/reload", "/api/v1/faults"])
@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer wrong", f"Basic {API_KEY}", f"Bearer {API_KEY}x", API_KEY],
)
def test_every_route_but_health_and_ready_needs_the_key(hostile_router, path, authorization):
    headers = {} if authorization is None else {"Authorization": authorization}
    method = "POST" if path in ROUTER_POST or path.startswith("/api/v1/r") else "GET"
    if path == "/api/v1/faults":
        method = "POST"
    answer = httpx.request(method, hostile_router.url + path, headers=headers, timeout=10)
    if path in OPEN_PATHS:
        assert answer.status_code < 400
    else:
        assert answer.status_code == 401, (path, authorization, answer.text)
        assert answer.json()["error"]["code"] == "invalid_api_key"
        assert answer.headers["www-authenticate"] == "Bearer"
        assert API_KEY not in answer.text


def test_key_comparison_is_constant_time_and_checks_every_key(monkeypatch):
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counting(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    check = ApiKeyCheck(["first-key", "second-key", "third-key"])
    assert check.allows("/v1/embeddings", b"Bearer first-key")
    assert len(calls) == 3, "a match must not stop the loop early (timing tells which key)"
    calls.clear()
    assert not check.allows("/v1/embeddings", b"Bearer nope")
    assert len(calls) == 3


def test_fault_route_is_404_when_the_router_was_not_started_with_the_env(hostile_router):
    answer = httpx.post(
        hostile_router.url + "/api/v1/faults",
        json={"deployment": "primary", "replica": 0, "mode": "exit"},
        headers=hostile_router.headers,
        timeout=10,
    )
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "not_found"


# -- no secrets in logs --------------------------------------------------------------------
def test_api_key_never_appears_in_router_logs(hostile_router):
    url = hostile_router.url
    good = hostile_router.headers
    with httpx.Client(base_url=url, timeout=10) as client:
        client.post("/v1/embeddings", json={"model": "primary", "input": "x"}, headers=good)
        client.post("/v1/embeddings", content=b"[" * 50_000, headers=good)  # error paths
        client.post("/v1/embeddings", content=b"{", headers=good)
        client.get("/metrics", headers={"Authorization": f"Bearer {API_KEY}-almost"})
        client.get("/nope", headers=good)
    logs = hostile_router.stderr_text() + hostile_router.stdout_text()
    assert logs.strip(), "the router logged nothing at all: the check would be vacuous"
    assert API_KEY not in logs
    assert API_KEY[:12] not in logs


# -- spawning ------------------------------------------------------------------------------
def test_workers_are_spawned_from_an_argv_list_without_a_shell(hostile_router):
    hostile = Deployment(artifact="/tmp/m; rm -rf ~ `id` $(id) | cat")
    argv = worker_argv(hostile, "cpu", 1, "/run/sr/x.sock")
    assert isinstance(argv, list) and argv[0] == sys.executable
    assert argv[argv.index("--artifact") + 1] == hostile.artifact  # one element, unparsed
    (pid,) = hostile_router.initial_pids

    def parent_of(child: int) -> int:
        return int(Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[1])

    # A CPU worker is forked by its model's fork server, forked by sr's fork server
    # (sr.pool.forkserver, both), itself a child of sr serve (or by sr's fork server, or
    # spawned, when one fails); either way no shell stands between sr serve and the worker.
    chain = [pid]
    while (parent := parent_of(chain[-1])) != hostile_router.proc.pid:
        server = Path(f"/proc/{parent}/cmdline").read_bytes().split(b"\0")
        assert server[1:3] == [b"-m", b"sr.pool.forkserver"], server
        chain.append(parent)
        assert len(chain) <= 3, "the fork servers are sr serve's child and grandchild"
    for process in chain:
        cmdline = Path(f"/proc/{process}/cmdline").read_bytes().split(b"\0")
        assert Path(cmdline[0].decode()).name.startswith("python"), cmdline


# -- limits on every read ------------------------------------------------------------------
def _raw_exchange(port: int, request: bytes, timeout_s: float = 10.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(request)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def test_oversized_request_headers_are_refused(hostile_router):
    request = b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n"
    answer = _raw_exchange(hostile_router.port, request)
    status_line = answer.split(b"\r\n", 1)[0]
    assert status_line.startswith(b"HTTP/1.1 4"), status_line


def test_bad_content_length_is_400(hostile_router):
    request = (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer "
        + API_KEY.encode()
        + b"\r\nContent-Length: 99999999999999999999\r\nConnection: close\r\n\r\n{}"
    )
    answer = _raw_exchange(hostile_router.port, request)
    assert answer.split(b"\r\n", 1)[0][:10] == b"HTTP/1.1 4", answer[:200]


def test_the_router_bounds_every_phase_of_a_connection():
    # Behaviour under these limits: tests/router/test_front_door.py (a slow head gets 408
    # from its first byte, an idle connection closes, a caller that never reads is reset,
    # the connection cap) and tests/router/test_front_door_soak.py. Here: the router's own
    # settings keep each bounded, with the head far shorter than the idle timeout.
    http = ROUTER_HTTP_LIMITS
    assert 0 < http.head_timeout_s <= 10 < http.keep_alive_timeout_s <= 120
    assert 0 < http.write_timeout_s <= 60 and 0 < http.body_timeout_s <= 60
    assert http.max_header_bytes <= 64 * 1024
    assert 0 < http.max_connections <= 10_000
