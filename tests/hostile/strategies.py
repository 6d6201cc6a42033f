"""Hypothesis strategies for hostile request bodies, and the check every answer must pass."""

from __future__ import annotations

import json

import httpx
from hypothesis import strategies as st

ROUTER_POST = ["/v1/embeddings", "/v1/classify", "/v1/decisions"]
ROUTER_GET = [
    "/health",
    "/ready",
    "/startup-status",
    "/v1/models",
    "/api/v1/inventory/model-runtime",
    "/metrics",
]
OTHER_PATHS = ["/", "/v1", "/v1/embeddings/", "/api/v1/faults", "/admin/faults", "/%00", "/.."]
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH"]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
json_values = st.recursive(
    scalars,
    lambda kids: (
        st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=8), kids, max_size=5)
    ),
    max_leaves=25,
)
huge_strings = st.integers(min_value=50_000, max_value=150_000).map(lambda n: "é" * n)
many_inputs = st.integers(min_value=2_000, max_value=10_000).map(
    lambda n: [f"input {i}" for i in range(n)]
)
field_values = json_values | huge_strings | many_inputs | st.lists(st.text(max_size=30), max_size=4)
models = st.sampled_from(["primary", "", "nope", 0, None, ["primary"], "primary\x00"])
native_objects = st.fixed_dictionaries(
    {"model": models},
    optional={
        "input": field_values,
        "labels": field_values | st.dictionaries(st.text(max_size=8), st.text(max_size=20)),
        "state": field_values,
        "questions": field_values,
        "encoding_format": field_values,
        "extra": json_values,
    },
)
deep_nesting = st.tuples(
    st.integers(min_value=100, max_value=200_000), st.sampled_from([("[", "]"), ('{"a":', "}")])
).map(lambda t: (t[1][0] * t[0] + "1" + t[1][1] * t[0]).encode())
long_numbers = st.integers(min_value=4_000, max_value=20_000).map(
    lambda n: b'{"model":"primary","input":' + b"7" * n + b"}"
)
bodies = st.one_of(
    native_objects.map(lambda o: json.dumps(o).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=600),
    deep_nesting,
    long_numbers,
    st.just(b""),
)


def assert_well_formed(answer: httpx.Response, what: str, *, tei: bool = False) -> None:
    """Never a 5xx; a 4xx is `{"error": {"code", "message"}}` (TEI's routes: `{"error":
    message, "error_type"}`, sr.router.tei); a 2xx parses."""
    status = answer.status_code
    assert status < 500, f"{what}: {status} {answer.content[:300]!r}"
    if status >= 400:
        try:
            body = answer.json()
        except ValueError:
            text = answer.content[:300]
            raise AssertionError(f"{what}: {status} is not JSON: {text!r}") from None
        if tei:
            assert isinstance(body, dict), f"{what}: {body!r:.300}"
            assert isinstance(body.get("error"), str) and body["error"], f"{what}: {body!r:.300}"
            assert isinstance(body.get("error_type"), str), f"{what}: {body!r:.300}"
            return
        assert isinstance(body, dict) and set(body) == {"error"}, f"{what}: {body!r:.300}"
        error = body["error"]
        assert isinstance(error.get("code"), str) and error["code"], f"{what}: {body!r:.300}"
        assert isinstance(error.get("message"), str), f"{what}: {body!r:.300}"
    elif "text/plain" not in answer.headers.get("content-type", ""):
        answer.json()
