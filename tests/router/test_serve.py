"""serve() over a real loopback socket with a fake pool: listen early, ready, reload, stop."""

from __future__ import annotations

import io
import socket

import httpx
import pytest
import trio

from sr.config.load import dump_config
from sr.errors import SrError, StartupFailed
from sr.events import RecordingSink
from sr.router import serve as serve_module
from sr.router.serve import serve

from .fake_core import FakeRouterCore, fake_open_router, make_config


async def get(url: str, **kwargs) -> httpx.Response:
    async with httpx.AsyncClient(timeout=5) as client:
        return await client.get(url, **kwargs)


async def post(url: str, **kwargs) -> httpx.Response:
    async with httpx.AsyncClient(timeout=5) as client:
        return await client.post(url, **kwargs)


async def test_listens_before_ready_then_serves_reloads_and_stops(tmp_path):
    config = make_config({"primary": 2})
    config_path = tmp_path / "config.yaml"
    config_path.write_text(dump_config(config))
    cores: list[FakeRouterCore] = []
    out = io.StringIO()
    sink = RecordingSink()

    def make(cfg):
        core = FakeRouterCore(cfg)
        core.ready = False
        return core

    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            handle = await nursery.start(
                lambda task_status: serve(
                    config,
                    config_path=config_path,
                    host="127.0.0.1",
                    port=0,
                    events=sink,
                    ready_timeout_s=10,
                    open_router=fake_open_router(cores, make),
                    out=out,
                    task_status=task_status,
                )
            )
            url = handle.url
            assert url.startswith("http://127.0.0.1:")
            assert (await get(url + "/health")).status_code == 200
            assert (await get(url + "/ready")).status_code == 503
            assert (await get(url + "/startup-status")).json()["ready"] is False
            sink.emit("replica_state", deployment="primary", replica="primary-0", state="loading")
            cores[0].ready = True
            while "sr: serving on" not in out.getvalue():
                await trio.sleep(0.01)
            assert (await get(url + "/ready")).status_code == 200
            answer = await post(url + "/v1/embeddings", json={"model": "primary", "input": "x"})
            assert answer.status_code == 200
            assert answer.json()["model"] == "primary"
            metrics = await get(url + "/metrics")
            assert "sr_requests_total" in metrics.text

            bigger = make_config({"primary": 3})
            config_path.write_text(dump_config(bigger))
            reloaded = await post(url + "/api/v1/reload")
            assert reloaded.status_code == 200
            assert reloaded.json()["deployments"]["primary"]["replicas"] == 3
            assert len(cores[0].reloads[0].deployments["primary"].placements()) == 3

            config_path.write_text("global: {nonsense: 1}\n")
            rejected = await post(url + "/api/v1/reload")
            assert rejected.status_code == 400
            assert rejected.json()["error"]["code"] == "invalid_config"
            config_path.write_text(dump_config(bigger))
            cores[0].reload_error = SrError("replica primary-2 failed: golden check")
            failed = await post(url + "/api/v1/reload")
            assert failed.status_code == 409
            assert "golden check" in failed.json()["error"]["message"]

            handle.shutdown()
    assert out.getvalue().splitlines()[1:] == [  # replica states are the log's, not stdout's
        f"sr: serving on {url}: 2/2 replicas of primary ready",
        "sr: all replicas ready (2/2)",
    ]
    assert [e for e, _ in sink.events if e.startswith("router_")] == [
        "router_listening",
        "router_ready",
    ]


async def test_startup_failure_raises_after_listening():
    config = make_config({"primary": 1})
    cores: list[FakeRouterCore] = []

    def make(cfg):
        core = FakeRouterCore(cfg)
        core.wait_ready_error = SrError("deployment 'primary' cannot start: replica failed")
        return core

    with trio.fail_after(10), pytest.raises(SrError, match="cannot start"):
        await serve(
            config,
            port=0,
            events=RecordingSink(),
            ready_timeout_s=5,
            open_router=fake_open_router(cores, make),
            out=io.StringIO(),
        )


@pytest.mark.parametrize(
    ("host", "error", "line"),
    [
        ("127.0.0.1", PermissionError(13, "Permission denied"), "127.0.0.1:80: Permission denied"),
        ("::1", OSError(98, "Address already in use"), "[::1]:80: Address already in use"),
        ("nowhere", socket.gaierror(-2, "Name or service not known"), "nowhere:80: Name or"),
    ],
)
async def test_a_listener_that_cannot_bind_fails_before_the_pool_opens(
    monkeypatch, host, error, line
):
    async def refuse(**_):
        raise error

    cores: list[FakeRouterCore] = []
    monkeypatch.setattr(serve_module, "open_listeners", refuse)
    with pytest.raises(StartupFailed) as failed:
        await serve(
            make_config({"primary": 1}), host=host, port=80,
            open_router=fake_open_router(cores, FakeRouterCore), ready_timeout_s=1,
        )  # fmt: skip
    assert str(failed.value).startswith(f"cannot listen on {line}")
    assert cores == []  # no pool, so no worker, was ever started
