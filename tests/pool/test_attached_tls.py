"""Attached workers behind TLS, with a key: the router verifies https with the configured CA
bundle (httpx), sends the key it is configured with, and verifies a discovered worker's
certificate against the discovered name, not the address it dials.

The worker is a real `sr worker` (loopback, with a key); TLS terminates in a test-only
proxy in front of it (docs/decisions.md: the worker's own listener stays plaintext). The
CA and the certificate are made with the `openssl` command in tmp_path."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from sr.config.schema import Deployment, Replica, SrConfig
from sr.pool import open_router
from sr.pool.state import ReplicaState
from tests.worker.test_http_e2e import stop

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command"),
]

KEY = "tls-test-worker-key"
NAME = "workers.sr.test"  # the discovered name the certificate is issued for
PROXY_HOST = "127.0.0.2"


def make_ca_and_certificate(folder: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key): the server's names are NAME and
    the address PROXY_HOST."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=folder)

    new_key = ("-newkey", "rsa:2048", "-nodes")
    ca_extensions = ("-addext", "basicConstraints=critical,CA:TRUE")
    ca_key_usage = ("-addext", "keyUsage=keyCertSign")
    openssl("req", "-x509", *new_key, "-days", "2", "-keyout", "ca.key", "-out", "ca.pem",
            "-subj", "/CN=sr test CA", *ca_extensions, *ca_key_usage)  # fmt: skip
    openssl("req", *new_key, "-keyout", "server.key", "-out", "server.csr", "-subj", f"/CN={NAME}")
    (folder / "san.ext").write_text(f"subjectAltName=DNS:{NAME},IP:{PROXY_HOST}\n")
    signed_by_ca = ("-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial")
    openssl("x509", "-req", "-in", "server.csr", *signed_by_ca, "-days", "2",
            "-out", "server.pem", "-extfile", "san.ext")  # fmt: skip
    return folder / "ca.pem", folder / "server.pem", folder / "server.key"


async def pump(source: trio.abc.Stream, sink: trio.abc.Stream) -> None:
    try:
        while data := await source.receive_some(65536):
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def tls_proxy(context: ssl.SSLContext, upstream_port: int, *, task_status) -> None:
    """Terminate TLS on PROXY_HOST:(free port) and relay bytes to the worker's port."""
    listeners = await trio.open_ssl_over_tcp_listeners(
        0, context, host=PROXY_HOST, https_compatible=True
    )
    port = listeners[0].transport_listener.socket.getsockname()[1]

    async def relay(client: trio.SSLStream) -> None:
        try:
            async with (
                client,
                await trio.open_tcp_stream("127.0.0.1", upstream_port) as up,
                trio.open_nursery() as nursery,
            ):

                async def one_way(a, b) -> None:
                    await pump(a, b)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(one_way, client, up)
                nursery.start_soon(one_way, up, client)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # a client that refused our certificate, or a connection torn down

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, relay, listeners)
        task_status.started(port)


@pytest.fixture(scope="module")
def keyed_worker(tiny_model_dir):
    """A real worker on 127.0.0.1 (plaintext, loopback) that wants KEY; yields its port."""
    argv = ["--artifact", str(tiny_model_dir), "--port", "0", "--api-key", KEY]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sr", "worker", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # nobody reads it while the module's tests run
        text=True,
    )
    try:
        yield json.loads(proc.stdout.readline())["port"]
    finally:
        stop(proc)


@pytest.fixture
def certificates(tmp_path):
    return make_ca_and_certificate(tmp_path)


def deployment_of(artifact: str, replica: Replica) -> SrConfig:
    cfg = SrConfig()
    cfg.deployments["primary"] = Deployment(artifact=artifact, replicas=[replica])
    return cfg


class OneAddress:
    """Any name resolves to the proxy."""

    def __init__(self, port: int) -> None:
        self.port = port

    async def resolve(self, host: str, port: int):
        return [(PROXY_HOST, self.port)]


async def row_when_settled(core, *, want_ready: bool, timeout_s: float = 30) -> dict:
    """The one replica's inventory row, once it is ready (or has given a reason)."""
    with trio.fail_after(timeout_s):
        while True:
            rows = core.inventory().deployments["primary"].replicas
            if rows and (rows[0].ready if want_ready else rows[0].reason):
                return rows[0]
            await trio.sleep(0.05)


async def test_https_endpoint_and_discovered_fleet_verified_with_the_ca_bundle_and_keyed(
    keyed_worker, certificates, tiny_model_dir, tmp_path, monkeypatch
):
    ca, cert, key = certificates
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    monkeypatch.setenv("SR_TEST_TLS_KEY", KEY)
    monkeypatch.setenv("SR_TEST_TLS_WRONG_KEY", "not-the-key")
    artifact = str(tiny_model_dir)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(tls_proxy, context, keyed_worker)
        url = f"https://{PROXY_HOST}:{port}"

        # an https endpoint, verified with the CA bundle, keyed: serves
        endpoint = Replica(endpoint=url, model=artifact, ca_bundle=str(ca))
        endpoint.api_key_env = "SR_TEST_TLS_KEY"
        async with open_router(deployment_of(artifact, endpoint), run_dir=tmp_path / "r1") as core:
            await core.wait_ready(30)
            answer = await core.embed("primary", ["over tls", "with a key"])
            assert len(answer.vectors) == 2

        # a discovered fleet over https: dialled by address, verified against the name
        discovered = Replica(
            discover=f"dns://{NAME}:{port}",
            model=artifact,
            scheme="https",
            ca_bundle=str(ca),
            api_key_env="SR_TEST_TLS_KEY",
        )
        async with open_router(
            deployment_of(artifact, discovered),
            run_dir=tmp_path / "r2",
            resolver=OneAddress(port),
        ) as core:
            await core.wait_ready(30)
            assert len((await core.embed("primary", "discovered")).vectors) == 1
            row = core.inventory().deployments["primary"].replicas[0]
            assert row.endpoint == url and row.state.value == "ready"

        # another name for the same address: the certificate does not carry it, so the
        # worker is refused although its address is in the certificate
        other = Replica(
            discover=f"dns://other.sr.test:{port}",
            model=artifact,
            scheme="https",
            ca_bundle=str(ca),
            api_key_env="SR_TEST_TLS_KEY",
        )
        async with open_router(
            deployment_of(artifact, other), run_dir=tmp_path / "r5", resolver=OneAddress(port)
        ) as core:
            with trio.move_on_after(3):
                await core.wait_ready(30)
            assert not core.is_ready()
            (entry,) = core.inventory().deployments["primary"].discovery
            (row,) = entry.discovered
            assert (row.status, row.state.value) == ("joining", "unreachable")
            assert "CERTIFICATE_VERIFY_FAILED" in row.reason, row.reason
            assert "other.sr.test" in row.reason  # checked against the discovered name

        # without the CA bundle (httpx's default roots): the certificate is refused
        untrusted = Replica(endpoint=url, model=artifact, api_key_env="SR_TEST_TLS_KEY")
        async with open_router(deployment_of(artifact, untrusted), run_dir=tmp_path / "r3") as core:
            row = await row_when_settled(core, want_ready=False)
            assert row.state is ReplicaState.UNREACHABLE
            assert "CERTIFICATE_VERIFY_FAILED" in row.reason, row.reason

        # the wrong key: /health is open, but the card is refused, so it never serves
        wrong = Replica(endpoint=url, model=artifact, ca_bundle=str(ca))
        wrong.api_key_env = "SR_TEST_TLS_WRONG_KEY"
        async with open_router(deployment_of(artifact, wrong), run_dir=tmp_path / "r4") as core:
            row = await row_when_settled(core, want_ready=False)
            assert row.state is ReplicaState.UNREACHABLE and not core.is_ready()
        nursery.cancel_scope.cancel()
    assert os.environ["SR_TEST_TLS_KEY"] == KEY  # the key stayed in the environment only
