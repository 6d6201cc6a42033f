"""The front door against web pages (sr.router.guard): a loopback listener answers only
loopback Host names, a foreign Origin is refused unless CORS allows it, and POST bodies
must be JSON. What a DNS-rebinding or cross-site page sends is refused before any route."""

from __future__ import annotations

import pytest

from sr.router.app import RouterApp
from sr.router.cache import ResultCache
from sr.router.guard import FrontDoorGuard, check_json_body, host_name, is_loopback_name
from sr.router.metrics import RouterMetrics

from .asgi_client import call
from .fake_core import FakeRouterCore, make_config

EMBED = {"model": "primary", "input": "hi"}
ATTACKER = {"Host": "attacker.example:8899", "Origin": "https://attacker.example"}


def build(*, host="127.0.0.1", allowed_hosts=(), origins=(), reload=None):
    config = make_config({"primary": 1})
    config.listeners[0].host = host
    config.listeners[0].allowed_hosts = list(allowed_hosts)
    config.listeners[0].cors_allow_origins = list(origins)
    core = FakeRouterCore(config)
    app = RouterApp(
        core, config, metrics=RouterMetrics(core.inventory), cache=ResultCache(0), reload=reload
    )
    return app, core


@pytest.mark.parametrize(
    "name", ["localhost", "LOCALHOST.", "api.localhost", "127.0.0.1", "127.8.9.10", "[::1]"]
)
def test_loopback_names(name):
    assert is_loopback_name(name)


@pytest.mark.parametrize("name", ["attacker.example", "localhost.example", "10.0.0.1", "[::2]"])
def test_names_that_are_not_loopback(name):
    assert not is_loopback_name(name)


def test_host_names_lose_their_port():
    assert host_name("a.example:8899") == "a.example"
    assert host_name("[::1]:8899") == "[::1]"
    assert host_name("a.example") == "a.example"


async def test_the_reload_a_foreign_page_triggers_is_refused_and_nothing_reloads():
    reloads = []

    async def reload():
        reloads.append(1)
        return {"status": "reloaded"}

    app, _ = build(reload=reload)
    headers = {**ATTACKER, "Content-Type": "text/plain"}
    answer = await call(app, "POST", "/api/v1/reload", b"", headers=headers)
    assert answer.status == 403 and "attacker.example" in answer.json()["error"]["message"]
    # each rule alone refuses it too
    only_origin = {"Host": "127.0.0.1:8899", "Origin": "https://attacker.example"}
    assert (await call(app, "POST", "/api/v1/reload", b"", headers=only_origin)).status == 403
    only_type = {"Host": "127.0.0.1:8899", "Content-Type": "text/plain"}
    assert (await call(app, "POST", "/api/v1/reload", b"", headers=only_type)).status == 415
    assert reloads == []


async def test_a_rebinding_page_cannot_read_the_inventory():
    app, _ = build()
    answer = await call(
        app, "GET", "/api/v1/inventory/model-runtime", headers={"Host": "attacker.example"}
    )
    assert answer.status == 403
    assert answer.json()["error"]["code"] == "forbidden"
    ok = await call(app, "GET", "/api/v1/inventory/model-runtime", headers={"Host": "localhost"})
    assert ok.status == 200


async def test_allowed_hosts_add_names_and_a_public_listener_answers_any_name():
    app, _ = build(allowed_hosts=["sr.internal"])
    assert (await call(app, "GET", "/health", headers={"Host": "sr.internal:8899"})).status == 200
    assert (await call(app, "GET", "/health", headers={"Host": "other.internal"})).status == 403
    public, _ = build(host="0.0.0.0")
    assert (await call(public, "GET", "/health", headers={"Host": "10.1.2.3:8899"})).status == 200
    listed, _ = build(host="0.0.0.0", allowed_hosts=["sr.example"])
    assert (await call(listed, "GET", "/health", headers={"Host": "10.1.2.3"})).status == 403
    star, _ = build(allowed_hosts=["*"])
    assert (await call(star, "GET", "/health", headers={"Host": "anything"})).status == 200


async def test_text_plain_bodies_are_refused_with_415_and_json_ones_served():
    app, core = build()
    refused = ("text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
               "multipart/form-data; boundary=x")  # fmt: skip
    for content_type in refused:
        answer = await call(
            app, "POST", "/v1/embeddings", EMBED, headers={"Content-Type": content_type}
        )
        assert answer.status == 415, content_type
        assert answer.json()["error"]["code"] == "unsupported_media_type"
    assert core.calls == []
    for content_type in ("application/json", "application/json; charset=utf-8",
                         "Application/JSON", "application/vnd.api+json"):  # fmt: skip
        answer = await call(
            app, "POST", "/v1/embeddings", EMBED, headers={"Content-Type": content_type}
        )
        assert answer.status == 200, content_type
    assert (await call(app, "POST", "/v1/embeddings", EMBED)).status == 200  # none: JSON


async def test_the_requests_own_origin_is_served_and_an_allowed_one_too():
    app, _ = build(allowed_hosts=["sr.example"])
    same = {"Host": "sr.example", "Origin": "https://sr.example"}
    assert (await call(app, "POST", "/v1/embeddings", EMBED, headers=same)).status == 200
    cors, _ = build(origins=["http://127.0.0.2:3000"])
    allowed = {"Host": "127.0.0.1:8899", "Origin": "http://127.0.0.2:3000"}
    assert (await call(cors, "POST", "/v1/embeddings", EMBED, headers=allowed)).status == 200
    other = {"Host": "127.0.0.1:8899", "Origin": "http://127.0.0.3:3000"}
    assert (await call(cors, "POST", "/v1/embeddings", EMBED, headers=other)).status == 403
    null = {"Host": "127.0.0.1:8899", "Origin": "null"}  # a sandboxed frame or file:// page
    assert (await call(cors, "POST", "/v1/embeddings", EMBED, headers=null)).status == 403


def test_the_guards_rules_alone():
    guard = FrontDoorGuard("::1")
    guard.check_host(None)  # HTTP/1.0 without Host
    guard.check_host(b"[::1]:8899")
    check_json_body(None)
