"""Hostile input straight at a managed worker's Unix socket (no router in front)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.hostile.strategies import METHODS, assert_well_formed, bodies

WORKER_POST = ["/v1/embeddings", "/v1/classify", "/v1/decisions"]
WORKER_ALL = [*WORKER_POST, "/v1/models", "/health", "/health/live", "/metrics", "/admin/faults"]

FUZZ = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ
@given(path=st.sampled_from(WORKER_POST), body=bodies)
def test_worker_forward_routes_answer_hostile_bodies_with_4xx_json(worker_client, path, body):
    answer = worker_client.post(path, content=body)
    assert_well_formed(answer, f"worker POST {path} {body[:80]!r}")


@settings(FUZZ, max_examples=40)
@given(path=st.sampled_from(WORKER_ALL), method=st.sampled_from(METHODS), body=bodies)
def test_worker_every_route_and_method(worker_client, path, method, body):
    answer = worker_client.request(method, path, content=body)
    assert_well_formed(answer, f"worker {method} {path} {body[:80]!r}")


def test_worker_fault_route_is_404_without_the_env(worker_client):
    answer = worker_client.post("/admin/faults", json={"mode": "exit"})
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[" * 200_000,
        b'{"input":' + b"9" * 5000 + b"}",
        b'{"input":"\\ud800"}',
        b'{"input":"' + b"x" * (5 * 1024 * 1024) + b'"}',
        b'{"input":[' + b",".join(b'"r"' for _ in range(10_000)) + b"]}",
    ],
    ids=["empty", "deep", "5000-digits", "lone-surrogate", "5MiB", "10000-inputs"],
)
def test_worker_named_malformed_bodies(worker_client, body):
    answer = worker_client.post("/v1/embeddings", content=body)
    assert_well_formed(answer, repr(body[:60]))
    assert 400 <= answer.status_code < 500
