"""Around every request: its id, CORS, the access log, /openapi.json (sr.router.app `_http`)."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import yaml

from sr import request_id
from sr.logs import AccessLog, JsonLineFormatter
from sr.router.app import RouterApp
from sr.router.cache import ResultCache
from sr.router.metrics import RouterMetrics

from .asgi_client import call
from .fake_core import FakeReply, FakeRouterCore, make_config

EMBED = {"model": "primary", "input": "hi"}
ORIGIN = "https://app.example"


def build(*, api_keys=None, origins=(), handler=None, access_log=None):
    config = make_config({"primary": 1}, api_keys)
    config.listeners[0].cors_allow_origins = list(origins)
    core = FakeRouterCore(config) if handler is None else FakeRouterCore(config, handler)
    app = RouterApp(
        core,
        config,
        metrics=RouterMetrics(core.inventory),
        cache=ResultCache(0),
        fault_injection=False,
        access_log=access_log,
    )
    return app, core


async def test_every_answer_carries_a_new_request_id_that_reaches_the_worker():
    app, core = build()
    first = await call(app, "POST", "/v1/embeddings", EMBED)
    second = await call(app, "POST", "/v1/embeddings", EMBED)
    health = await call(app, "GET", "/health")
    ids = [answer.headers["x-request-id"] for answer in (first, second, health)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", rid) for rid in ids)
    assert len(set(ids)) == 3
    assert core.request_ids == ids[:2]
    assert request_id.current.get() is None  # reset once the request is answered


async def test_the_callers_request_id_is_echoed_passed_on_and_put_in_error_bodies():
    app, core = build()
    answer = await call(app, "POST", "/v1/embeddings", EMBED, headers={"X-Request-Id": "abc-1"})
    assert answer.headers["x-request-id"] == "abc-1"
    assert core.request_ids == ["abc-1"]
    bad = await call(app, "POST", "/v1/embeddings", {"input": "hi"}, {"X-Request-Id": "abc-2"})
    assert bad.status == 400
    assert bad.json()["error"]["request_id"] == "abc-2" == bad.headers["x-request-id"]


async def test_an_unusable_request_id_is_refused_naming_the_header():
    app, core = build()
    for value in ("x" * 129, "has space", "tab\there"):
        answer = await call(app, "POST", "/v1/embeddings", EMBED, headers={"X-Request-Id": value})
        assert answer.status == 400
        error = answer.json()["error"]
        assert error["param"] == "X-Request-Id" and "X-Request-Id" in error["message"]
        assert error["request_id"] == answer.headers["x-request-id"] != value
    assert core.calls == []


async def test_a_workers_error_passes_through_with_its_request_id():
    async def failing(deployment, path, body, timeout_s):
        payload = {"error": {"code": "invalid_request", "message": "input: bad"}}
        return FakeReply(400, {}, json.dumps(payload).encode(), "primary-0")

    app, _ = build(handler=failing)
    answer = await call(app, "POST", "/v1/embeddings", EMBED, headers={"X-Request-Id": "r-9"})
    assert answer.status == 400 and answer.headers["x-request-id"] == "r-9"


async def test_cors_is_off_unless_origins_are_listed_and_then_no_foreign_origin_is_served():
    app, core = build(api_keys=["k"])
    preflight = await call(app, "OPTIONS", "/v1/embeddings", headers=_preflight_headers(ORIGIN))
    assert preflight.status == 403 and ORIGIN in preflight.json()["error"]["message"]
    answer = await call(app, "GET", "/health", headers={"Origin": ORIGIN})
    assert answer.status == 403 and "access-control-allow-origin" not in answer.headers
    headers = {"Origin": ORIGIN, "Authorization": "Bearer k"}
    embed = await call(app, "POST", "/v1/embeddings", EMBED, headers=headers)
    assert embed.status == 403 and core.calls == []


async def test_a_preflight_is_answered_before_the_api_key_check():
    app, core = build(api_keys=["k"], origins=[ORIGIN])
    answer = await call(app, "OPTIONS", "/v1/embeddings", headers=_preflight_headers(ORIGIN))
    assert answer.status == 204 and answer.body == b""
    # exactly one of each: browsers refuse an Access-Control-Allow-Origin with two values
    assert answer.all("access-control-allow-origin") == [ORIGIN]
    assert answer.all("vary") == ["Origin"]
    assert answer.all("access-control-allow-methods") == ["GET, POST, OPTIONS"]
    assert answer.all("access-control-allow-headers") == ["authorization, content-type"]
    assert core.calls == []


async def test_a_preflight_from_another_origin_is_refused_naming_it():
    app, _ = build(origins=[ORIGIN])
    answer = await call(
        app, "OPTIONS", "/v1/embeddings", headers=_preflight_headers("https://evil.example")
    )
    assert answer.status == 403
    assert "https://evil.example" in answer.json()["error"]["message"]
    assert "access-control-allow-origin" not in answer.headers


async def test_answers_to_an_allowed_origin_say_so_and_expose_sr_headers():
    app, _ = build(api_keys=["k"], origins=[ORIGIN])
    headers = {"Origin": ORIGIN, "Authorization": "Bearer k"}
    answer = await call(app, "POST", "/v1/embeddings", EMBED, headers=headers)
    assert answer.status == 200
    assert answer.headers["access-control-allow-origin"] == ORIGIN
    assert "x-request-id" in answer.headers["access-control-expose-headers"]
    refused = await call(app, "POST", "/v1/embeddings", EMBED, headers={"Origin": ORIGIN})
    assert refused.status == 401  # a browser reads the refusal too
    assert refused.headers["access-control-allow-origin"] == ORIGIN
    assert answer.all("access-control-allow-origin") == [ORIGIN]
    other = await call(
        app, "POST", "/v1/embeddings", EMBED, headers={**headers, "Origin": "https://b.example"}
    )
    assert other.status == 403 and "access-control-allow-origin" not in other.headers


async def test_a_reload_adopts_new_origins():
    app, _ = build(origins=[ORIGIN])
    config = make_config({"primary": 1})
    config.listeners[0].cors_allow_origins = ["https://b.example"]
    app.apply_config(config)
    old = await call(app, "OPTIONS", "/v1/embeddings", headers=_preflight_headers(ORIGIN))
    new = await call(
        app, "OPTIONS", "/v1/embeddings", headers=_preflight_headers("https://b.example")
    )
    assert (old.status, new.status) == (403, 204)


async def test_openapi_json_is_the_shipped_document_true_to_the_config():
    """With keys: the shipped document's security, components and routes, less the fault
    route (fault injection is off); the request bodies name the deployments
    (tests/router/test_openapi_doc.py). Without: no security requirement either, so no
    tester expects a key to be checked."""
    shipped = yaml.safe_load(
        (Path(__file__).parents[2] / "sr" / "router" / "openapi.yaml").read_text()
    )
    del shipped["paths"]["/api/v1/faults"]
    app, _ = build(api_keys=["k"])
    answer = await call(app, "GET", "/openapi.json", headers={"Authorization": "Bearer k"})
    assert answer.status == 200 and answer.headers["content-type"] == "application/json"
    served = answer.json()
    assert served["security"] == shipped["security"]
    assert served["components"] == shipped["components"]
    assert set(served["paths"]) == set(shipped["paths"])
    assert served["paths"]["/health"] == shipped["paths"]["/health"]
    open_app, _ = build()
    document = (await call(open_app, "GET", "/openapi.json")).json()
    assert "security" not in document
    assert all(
        "security" not in operation
        for operations in document["paths"].values()
        for operation in operations.values()
    )
    assert set(document["paths"]) == set(shipped["paths"])


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(JsonLineFormatter())
        self.lines: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


async def test_the_access_log_has_one_line_per_request():
    lines = Lines()
    logger = logging.getLogger("tests.access")
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    logger.propagate = False

    async def answered(deployment, path, body, timeout_s):
        headers = {"x-sr-timing": "2 0 0 1 3 9"}  # sr.worker.timing: 3 tokens
        return FakeReply(200, headers, b'{"object":"list","data":[]}', "primary-0")

    app, _ = build(handler=answered, access_log=AccessLog(enabled=True, logger=logger))
    ok = await call(app, "POST", "/v1/embeddings", EMBED, headers={"X-Request-Id": "a-1"})
    missing = await call(app, "GET", "/nowhere")
    assert [ok.status, missing.status] == [200, 404]
    first, second = lines.lines  # one line each, nothing else
    assert first["event"] == "access"
    assert {k: first[k] for k in ("request_id", "method", "route", "deployment", "replica")} == {
        "request_id": "a-1",
        "method": "POST",
        "route": "/v1/embeddings",
        "deployment": "primary",
        "replica": "primary-0",
    }
    assert (first["status"], first["tokens"]) == (200, 3) and first["ms"] >= 0
    assert second["request_id"] == missing.headers["x-request-id"]
    assert (second["route"], second["status"], second["deployment"]) == ("/nowhere", 404, None)
    assert second["replica"] is None and second["tokens"] is None


async def test_a_log_line_written_while_answering_carries_the_request_id():
    async def broken(deployment, path, body, timeout_s):
        raise RuntimeError("a bug")

    app, _ = build(handler=broken)
    lines = Lines()  # formats as it is handed each record, as sr's stderr handler does
    logger = logging.getLogger("sr.events")
    logger.addHandler(lines)
    try:
        answer = await call(app, "POST", "/v1/embeddings", EMBED, headers={"X-Request-Id": "b-2"})
    finally:
        logger.removeHandler(lines)
    assert answer.status == 500
    (line,) = [line for line in lines.lines if "router_internal_error" in line["message"]]
    assert line["request_id"] == "b-2"
    assert answer.json()["error"]["request_id"] == "b-2"


def _preflight_headers(origin: str) -> dict[str, str]:
    return {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }


async def test_an_odd_token_header_from_a_worker_costs_neither_the_answer_nor_the_line():
    lines = Lines()
    logger = logging.getLogger("tests.access.odd")
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    logger.propagate = False

    async def odd(deployment, path, body, timeout_s):  # an attached worker of another make
        headers = {"x-sr-timing": "many soon", "x-compute-tokens": "7"}
        return FakeReply(200, headers, b'{"object":"list","data":[]}', "primary-0")

    app, _ = build(handler=odd, access_log=AccessLog(enabled=True, logger=logger))
    answer = await call(app, "POST", "/v1/embeddings", EMBED)
    assert answer.status == 200
    (line,) = lines.lines
    assert (line["status"], line["tokens"]) == (200, None)
