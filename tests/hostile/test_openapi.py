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
    metrics = RouterMetrics(core.inventory)
    app = RouterApp(core, config, metrics=metrics, cache=ResultCache(0), fault_injection=True)
    paths = yaml.safe_load(SPEC.read_text())["paths"]
    # The app's route table, every path and method, is what the document describes.
    served = {(path, method.lower()) for path, methods in app._routes.items() for method in methods}
    served |= {
        (prefix + "{model}", method.lower())
        for prefix, methods in app._prefix_routes
        for method in methods
    }
    described = {(path, method) for path, operations in paths.items() for method in operations}
    assert served == described
    assert FAULTS_PATH in app._routes and set(app._routes) >= NATIVE_ROUTES


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
