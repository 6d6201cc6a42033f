"""GET /v1/models/{model} and the OpenAI error fields on the router's own errors."""

from __future__ import annotations

from sr.config.schema import Deployment, Replica
from sr.router.app import RouterApp
from sr.router.cache import ResultCache
from sr.router.metrics import RouterMetrics

from .asgi_client import call
from .fake_core import FakeRouterCore, make_config

HUB_NAME = "sentence-transformers/all-MiniLM-L6-v2"


def build():
    config = make_config({"primary": 2})
    config.deployments["hub"] = Deployment(artifact=HUB_NAME, replicas=[Replica(device="cpu")])
    core = FakeRouterCore(config)
    app = RouterApp(core, config, metrics=RouterMetrics(core.inventory), cache=ResultCache(0))
    return app


async def test_one_model_is_its_entry_of_the_list():
    app = build()
    listed = {m["id"]: m for m in (await call(app, "GET", "/v1/models")).json()["data"]}
    for name in ("primary", "hub"):
        answer = await call(app, "GET", f"/v1/models/{name}")
        assert answer.status == 200
        assert answer.json() == listed[name]


async def test_artifact_names_with_slashes_resolve():
    app = build()
    for name in (HUB_NAME, HUB_NAME + "/", "/models/primary"):
        answer = await call(app, "GET", f"/v1/models/{name}")
        assert answer.status == 200, (name, answer.json())
    assert (await call(app, "GET", f"/v1/models/{HUB_NAME}")).json()["id"] == "hub"
    assert (await call(app, "GET", "/v1/models//models/primary")).json()["id"] == "primary"


async def test_unknown_model_is_404_in_openai_shape():
    app = build()
    for name in ("nope", "", "a/b/c", "/"):
        answer = await call(app, "GET", f"/v1/models/{name}")
        assert answer.status == 404, name
        error = answer.json()["error"]
        assert error["code"] == "model_not_found"
        assert error["type"] == "invalid_request_error"
        assert error["param"] == "model"
        assert isinstance(error["message"], str)


async def test_only_get():
    answer = await call(build(), "POST", "/v1/models/primary", {})
    assert answer.status == 405
    assert answer.json()["error"]["type"] == "invalid_request_error"
    assert answer.json()["error"]["param"] is None


async def test_router_errors_carry_type_and_param():
    app = build()
    missing = await call(app, "POST", "/v1/embeddings", {"input": "x"})
    assert missing.status == 400
    assert missing.json()["error"] == {
        "code": "invalid_request",
        "message": "model: field is required",
        "type": "invalid_request_error",
        "param": "model",
        "request_id": missing.headers["x-request-id"],
    }
    unknown = await call(app, "POST", "/v1/embeddings", {"model": "nope", "input": "x"})
    assert unknown.status == 404
    assert unknown.json()["error"]["param"] == "model"
    bad_json = await call(app, "POST", "/v1/embeddings", b"{not json")
    assert bad_json.json()["error"]["param"] is None  # the body as a whole: no parameter
