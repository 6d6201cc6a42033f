"""sr/router/openapi.yaml (served as /openapi.json) describes every route the router
serves, and the error shape."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from sr import request_id
from sr.errors import InvalidRequest
from sr.router.app import NATIVE_ROUTES, RouterApp
from sr.router.cache import ResultCache
from sr.router.faults import FAULTS_PATH
from sr.router.metrics import RouterMetrics
from tests.router.fake_core import FakeRouterCore, make_config

SPEC = Path(__file__).resolve().parents[2] / "sr" / "router" / "openapi.yaml"


def test_every_served_route_is_described():
    config = make_config({"primary": 1})
    core = FakeRouterCore(config)
    app = RouterApp(core, config, metrics=RouterMetrics(core.inventory), cache=ResultCache(0))
    paths = yaml.safe_load(SPEC.read_text())["paths"]
    served = {*NATIVE_ROUTES, *app._get_routes, "/api/v1/reload", FAULTS_PATH}
    assert served <= set(paths), served - set(paths)
    for route in NATIVE_ROUTES:
        assert "post" in paths[route]
    for route in app._get_routes:
        assert "get" in paths[route]


def test_error_schema_matches_the_wire_shape():
    error = yaml.safe_load(SPEC.read_text())["components"]["schemas"]["Error"]
    assert error["required"] == ["error"]
    assert error["properties"]["error"]["required"] == ["code", "message", "type", "param"]
    token = request_id.current.set("r-1")  # errors carry the id of the request being answered
    try:
        wire = json.loads(InvalidRequest("input[0]: bad").body())["error"]
    finally:
        request_id.current.reset(token)
    assert wire["request_id"] == "r-1"
    assert set(wire) == set(error["properties"]["error"]["properties"])
