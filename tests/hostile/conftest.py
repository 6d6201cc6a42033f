"""One `sr serve` (one tiny-BERT worker, an API key, fault injection off) for the package."""

from __future__ import annotations

import httpx
import pytest

from tests.serve_process import ServeProcess, pid_alive, serve_config, worker_socket

API_KEY = "sk-hostile-7f3a9c2e5b1d"


@pytest.fixture(scope="package")
def hostile_router(tmp_path_factory, tiny_model_dir):
    workdir = tmp_path_factory.mktemp("hostile")
    process = ServeProcess(
        workdir,
        serve_config(tiny_model_dir, 1, api_keys=[API_KEY]),
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    process.start()
    process.artifact = str(tiny_model_dir)
    process.initial_pids = sorted(r["pid"] for r in process.replicas())
    yield process
    process.stop()


@pytest.fixture
def router_client(hostile_router):
    """An authorised client; after the test, the workers must be the same processes."""
    with httpx.Client(
        base_url=hostile_router.url, timeout=20.0, headers=hostile_router.headers
    ) as client:
        yield client
    assert sorted(r["pid"] for r in hostile_router.replicas()) == hostile_router.initial_pids
    assert all(pid_alive(pid) for pid in hostile_router.initial_pids)


@pytest.fixture
def worker_client(hostile_router):
    """A client straight at the (only) worker's Unix socket."""
    (pid,) = hostile_router.initial_pids
    transport = httpx.HTTPTransport(uds=worker_socket(pid))
    with httpx.Client(transport=transport, base_url="http://worker", timeout=20.0) as client:
        yield client
    assert sorted(r["pid"] for r in hostile_router.replicas()) == hostile_router.initial_pids
