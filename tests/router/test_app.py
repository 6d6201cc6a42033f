"""The front end against a fake Supervisor: routing, errors, auth, deadlines, cache."""

from __future__ import annotations

import json
import time

import pytest
import trio

from sr.errors import DeadlineExceeded, Overloaded, Unavailable, WorkerFailed
from sr.router.app import RouterApp
from sr.router.cache import ResultCache
from sr.router.metrics import RouterMetrics

from .asgi_client import call
from .fake_core import FakeReply, FakeRouterCore, make_config


def build(
    replicas=None, api_keys=None, handler=None, cache_entries=16, max_body=4096, faults=False
):
    config = make_config(replicas or {"primary": 2, "solo": 1}, api_keys)
    core = FakeRouterCore(config) if handler is None else FakeRouterCore(config, handler)
    app = RouterApp(
        core,
        config,
        metrics=RouterMetrics(core.inventory),
        cache=ResultCache(cache_entries),
        max_body_bytes=max_body,
        fault_injection=faults,
    )
    return app, core


def raising(error):
    async def handler(deployment, path, body, timeout_s):
        raise error

    return handler


CANCELED_LINE = (
    'sr_requests_total{deployment="primary",outcome="canceled",route="/v1/embeddings"} 1.0'
)


def stalling():
    """A handler that waits until cancelled: `(handler, started, cancelled)`."""
    started = trio.Event()
    cancelled: list[bool] = []

    async def handler(deployment, path, raw, timeout_s):
        started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled.append(True)
            raise

    return handler, started, cancelled


async def hang_up_mid_request(app, started: trio.Event) -> list:
    """One embeddings call whose caller hangs up once the dispatch started; what it got."""
    hang_up = trio.Event()
    result = []

    async def request():
        body = {"model": "primary", "input": "a"}
        result.append(await call(app, "POST", "/v1/embeddings", body, None, 1, hang_up))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(request)
        await started.wait()
        hang_up.set()
    return result


async def test_embeddings_forward_the_callers_body_and_answer_with_the_name_it_used():
    app, core = build()
    answer = await call(app, "POST", "/v1/embeddings", {"model": "primary", "input": "hi"})
    assert answer.status == 200
    assert answer.json()["model"] == "primary"
    assert answer.json()["data"][0]["embedding"] == [0.25, -0.5]
    assert answer.headers["x-sr-replica"] == "primary-0"
    deployment, path, body, timeout_s = core.calls[0]
    assert (deployment, path, timeout_s) == ("primary", "/v1/embeddings", None)
    assert json.loads(body) == {"model": "primary", "input": "hi"}  # sr.worker.served_as


async def test_the_callers_bytes_and_the_workers_answer_pass_through_untouched():
    """Neither side is changed by the router: the caller's bytes reach the worker and the
    worker's reach the caller, whichever name `model` holds (the worker settles it)."""
    answer_bytes = b'{"object":"list","model":"primary","data":[],"usage":{"n": 1}}'

    async def worker(deployment, path, body, timeout_s):
        return FakeReply(200, {}, answer_bytes, "primary-0")

    app, core = build(handler=worker)
    for raw in (b'{ "input" : ["a"],  "model": "primary" }', b'{"model":"/models/primary"}'):
        answer = await call(app, "POST", "/v1/embeddings", raw)
        assert core.calls[-1][2] == raw
        assert answer.body == answer_bytes


async def test_artifact_name_is_accepted_and_echoed():
    app, _ = build()
    answer = await call(app, "POST", "/v1/classify", {"model": "/models/primary", "input": "x"})
    assert answer.status == 200
    assert answer.json()["model"] == "/models/primary"


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"input": "hi"}', "model"),
        (b'{"model": 7, "input": "hi"}', "model"),
        (b'{"model": "", "input": "hi"}', "model"),
        (b"\xff\xfe", "not valid UTF-8"),
        (b'{"model": "primary", "input": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nested"),
        (b'{"model": "primary", "n": ' + b"9" * 5000 + b"}", "digits"),
    ],
)
async def test_bad_bodies_are_400_and_never_reach_a_worker(body, needle):
    app, core = build(max_body=64 * 1024)
    answer = await call(app, "POST", "/v1/decisions", body)
    assert answer.status == 400
    error = answer.json()["error"]
    assert error["code"] == "invalid_request"
    assert needle in error["message"]
    assert core.calls == []


async def test_unknown_model_is_404():
    app, core = build()
    answer = await call(app, "POST", "/v1/embeddings", {"model": "nope", "input": "hi"})
    assert answer.status == 404
    assert answer.json()["error"]["code"] == "model_not_found"
    assert core.calls == []


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (Overloaded("every replica is full"), 503, "overloaded"),
        (Unavailable("every replica is in backoff"), 503, "unavailable"),
        (DeadlineExceeded("deadline passed"), 504, "timeout"),
        (WorkerFailed("worker answered 500"), 502, "worker_failed"),
    ],
)
async def test_pool_errors_map_to_wire_errors(error, status, code):
    app, _ = build(handler=raising(error))
    answer = await call(app, "POST", "/v1/embeddings", {"model": "primary", "input": "hi"})
    assert answer.status == status
    request_id = answer.headers["x-request-id"]
    assert answer.json() == {
        "error": {
            "code": code,
            "message": error.message,
            "type": "server_error",
            "param": None,
            "request_id": request_id,
        }
    }
    if code == "overloaded":
        assert answer.headers["retry-after"] == "1"
    else:
        assert "retry-after" not in answer.headers


async def test_worker_4xx_passes_through():
    body = json.dumps({"error": {"code": "invalid_request", "message": "input[1]: too long"}})

    async def handler(deployment, path, raw, timeout_s):
        return FakeReply(400, {}, body.encode(), "primary-1")

    app, _ = build(handler=handler)
    answer = await call(app, "POST", "/v1/embeddings", {"model": "primary", "input": ["a", "b"]})
    assert answer.status == 400
    assert answer.json()["error"]["message"] == "input[1]: too long"


async def test_body_over_cap_is_413_by_header_and_while_reading():
    app, core = build(max_body=100)
    big = json.dumps({"model": "primary", "input": "x" * 200}).encode()
    answer = await call(app, "POST", "/v1/embeddings", big, {"content-length": str(len(big))})
    assert answer.status == 413
    assert answer.json()["error"]["code"] == "request_too_large"
    streamed = await call(app, "POST", "/v1/embeddings", big, chunks=4)  # no content-length
    assert streamed.status == 413
    assert core.calls == []


async def test_body_in_chunks_is_reassembled():
    app, core = build()
    body = json.dumps({"model": "primary", "input": "héllo " * 50}).encode()
    answer = await call(app, "POST", "/v1/embeddings", body, chunks=7)
    assert answer.status == 200
    assert json.loads(core.calls[0][2])["input"] == "héllo " * 50


async def test_deadline_header_becomes_timeout_s():
    app, core = build()
    headers = {"x-request-timeout-ms": "250"}
    answer = await call(app, "POST", "/v1/embeddings", {"model": "primary", "input": "a"}, headers)
    assert answer.status == 200
    assert core.calls[0][3] == pytest.approx(0.25)


@pytest.mark.parametrize(
    "value", ["0", "-5", "1.5", "soon", "", "3600001", "9" * 400, "1" * 5000, "0" * 20 + "5"]
)
async def test_bad_deadline_header_is_400(value):
    app, core = build()
    headers = {"x-request-timeout-ms": value}
    answer = await call(app, "POST", "/v1/embeddings", {"model": "primary", "input": "a"}, headers)
    assert answer.status == 400
    assert "X-Request-Timeout-Ms" in answer.json()["error"]["message"]
    assert answer.json()["error"]["param"] == "X-Request-Timeout-Ms"
    assert core.calls == []


async def test_the_longest_deadline_header_taken_is_an_hour():
    app, core = build()
    headers = {"x-request-timeout-ms": "3600000"}
    answer = await call(app, "POST", "/v1/embeddings", {"model": "primary", "input": "a"}, headers)
    assert answer.status == 200 and core.calls[0][3] == 3600.0


async def test_unknown_route_404_and_wrong_method_405():
    app, _ = build()
    missing = await call(app, "GET", "/v2/whatever")
    assert missing.status == 404
    assert missing.json()["error"]["code"] == "not_found"
    wrong = await call(app, "GET", "/v1/embeddings")
    assert wrong.status == 405
    assert wrong.headers["allow"] == "POST"
    assert (await call(app, "POST", "/health")).status == 405


async def test_health_ready_startup_status_inventory_models():
    app, core = build()
    core.ready = False
    assert (await call(app, "GET", "/health")).status == 200
    assert (await call(app, "GET", "/ready")).status == 503
    startup = await call(app, "GET", "/startup-status")
    assert startup.status == 200
    assert startup.json()["ready"] is False
    core.ready = True
    assert (await call(app, "GET", "/ready")).status == 200
    inventory = await call(app, "GET", "/api/v1/inventory/model-runtime")
    assert inventory.json()["deployments"]["primary"]["desired_replicas"] == 2
    models = (await call(app, "GET", "/v1/models")).json()["data"]
    by_id = {m["id"]: m for m in models}
    assert by_id["primary"] == {
        "id": "primary",
        "object": "model",
        "created": by_id["primary"]["created"],
        "owned_by": "sr",
        "artifact": "/models/primary",
        "replicas": 2,
        "ready_replicas": 2,
        "ready": True,
        "base_path": "/d/primary/",
    }
    assert by_id["solo"]["replicas"] == 1
    assert abs(by_id["primary"]["created"] - time.time()) < 60  # OpenAI's Unix seconds


async def test_api_keys_guard_everything_but_health_and_ready():
    app, core = build(api_keys=["k-one", "k-two"])
    body = {"model": "primary", "input": "a"}
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Basic k-one"}):
        denied = await call(app, "POST", "/v1/embeddings", body, headers)
        assert denied.status == 401
        assert denied.json()["error"]["code"] == "invalid_api_key"
        assert denied.headers["www-authenticate"] == "Bearer"
        assert "k-one" not in denied.body.decode()
    assert (await call(app, "GET", "/metrics")).status == 401
    assert (await call(app, "GET", "/v1/models")).status == 401
    assert (await call(app, "GET", "/health")).status == 200
    assert (await call(app, "GET", "/ready")).status == 200
    ok = await call(app, "POST", "/v1/embeddings", body, {"authorization": "Bearer k-two"})
    assert ok.status == 200
    assert len(core.calls) == 1


async def test_single_worker_deployment_caches_200_answers():
    app, core = build()
    body = {"model": "solo", "input": "same"}
    first = await call(app, "POST", "/v1/embeddings", body)
    # With a deadline and the keys in another order: same content, same key.
    again = await call(
        app, "POST", "/v1/embeddings", {"input": "same", "model": "solo"},
        {"x-request-timeout-ms": "900"},
    )  # fmt: skip
    assert len(core.calls) == 1
    assert again.headers["x-sr-replica"] == "cache"
    assert again.body == first.body
    # By artifact: the answer names the artifact, so it is another entry.
    by_artifact = await call(
        app, "POST", "/v1/embeddings", {"input": "same", "model": "/models/solo"}
    )
    assert len(core.calls) == 2
    assert by_artifact.json() == {**first.json(), "model": "/models/solo"}
    other_route = await call(app, "POST", "/v1/classify", body)
    assert other_route.status == 200
    assert len(core.calls) == 3


async def test_multi_replica_deployment_bypasses_cache():
    app, core = build()
    body = {"model": "primary", "input": "same"}
    await call(app, "POST", "/v1/embeddings", body)
    await call(app, "POST", "/v1/embeddings", body)
    assert len(core.calls) == 2


async def test_errors_are_not_cached_and_readiness_change_clears():
    answers = [FakeReply(400, {}, b'{"error":{"code":"invalid_request","message":"x"}}', "s")]

    async def handler(deployment, path, raw, timeout_s):
        if answers:
            return answers.pop()
        return FakeReply(200, {}, json.dumps({"model": "/models/solo"}).encode(), "solo-0")

    app, core = build(handler=handler)
    body = {"model": "solo", "input": "q"}
    assert (await call(app, "POST", "/v1/embeddings", body)).status == 400
    assert (await call(app, "POST", "/v1/embeddings", body)).status == 200
    assert (await call(app, "POST", "/v1/embeddings", body)).status == 200
    assert len(core.calls) == 2
    app.cache.on_event("replica_state", {"deployment": "solo", "replica": "solo-0", "state": "x"})
    await call(app, "POST", "/v1/embeddings", body)
    assert len(core.calls) == 3


async def test_caller_hanging_up_cancels_the_dispatch():
    handler, started, cancelled = stalling()
    app, _ = build(handler=handler)
    with trio.fail_after(5):
        result = await hang_up_mid_request(app, started)
    assert result == [None]  # nothing sent to a caller who left
    assert cancelled == [True]
    assert CANCELED_LINE in app.metrics.render().decode()


async def test_reload_route_reports_success_and_failure():
    app, _ = build()
    unavailable = await call(app, "POST", "/api/v1/reload")
    assert unavailable.status == 409
    calls = []

    async def reload():
        calls.append(1)
        return {"status": "reloaded"}

    app.set_reload(reload)
    answer = await call(app, "POST", "/api/v1/reload")
    assert answer.status == 200
    assert answer.json() == {"status": "reloaded"}
    assert (await call(app, "GET", "/api/v1/reload")).status == 405


async def test_internal_bug_is_a_json_500():
    app, _ = build(handler=raising(RuntimeError("boom")))
    answer = await call(app, "POST", "/v1/embeddings", {"model": "primary", "input": "a"})
    assert answer.status == 500
    assert answer.json()["error"]["code"] == "internal_error"


@pytest.mark.parametrize(
    ("enabled", "status", "code"), [(False, 404, "not_found"), (True, 400, "invalid_request")]
)
async def test_fault_route_is_wired_only_when_enabled(enabled, status, code):
    app, _ = build(faults=enabled)
    answer = await call(app, "POST", "/api/v1/faults", b'{"mode": "sideways"}')
    assert answer.status == status
    assert answer.json()["error"]["code"] == code
