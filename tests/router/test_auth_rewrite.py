"""API key check and the `model` rewrite helpers."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sr.errors import InvalidRequest
from sr.router.auth import ApiKeyCheck
from sr.router.rewrite import answer_with_public_model, forward_native, parse_native_body


def test_no_keys_allows_everything():
    assert ApiKeyCheck([]).allows("/v1/embeddings", None)


@pytest.mark.parametrize(
    ("header", "allowed"),
    [
        (None, False),
        (b"Bearer alpha", True),
        (b"bearer beta", True),
        (b"Bearer  beta ", True),
        (b"Bearer alph", False),
        (b"Bearer alphaa", False),
        (b"Token alpha", False),
        (b"alpha", False),
        (b"Bearer ", False),
    ],
)
def test_bearer_keys(header, allowed):
    check = ApiKeyCheck(["alpha", "beta"])
    assert check.allows("/metrics", header) is allowed


def test_open_paths_need_no_key():
    check = ApiKeyCheck(["alpha"])
    assert check.allows("/health", None)
    assert check.allows("/ready", None)
    assert not check.allows("/startup-status", None)


def test_parse_and_forward():
    raw = b'{"model": "primary", "input": "h\\u00e9"}'
    body, model = parse_native_body(raw)
    assert model == "primary"
    forwarded = json.loads(forward_native(raw, body, model, "/m/x"))
    assert forwarded == {"model": "/m/x", "input": "hé"}
    assert body["model"] == "primary"  # the caller's body is not mutated


def test_forward_renames_the_callers_bytes_in_place():
    raw = b'{ "input": ["a", "b"],\n  "model" : "primary", "k": 1 }'
    body, model = parse_native_body(raw)
    assert forward_native(raw, body, model, "/m/x") == (
        b'{ "input": ["a", "b"],\n  "model":"/m/x", "k": 1 }'
    )


def test_forward_naming_the_artifact_sends_the_callers_bytes_as_they_are():
    raw = b'{"input": "x", "model": "/m/x"}'
    body, model = parse_native_body(raw)
    assert forward_native(raw, body, model, "/m/x") is raw


@pytest.mark.parametrize(
    "raw",
    [
        # a label named `model`: two members by that name, only the top-level one renamed
        b'{"model": "primary", "input": "x", "labels": {"model": "primary"}}',
        # an escape that spells the top-level name; the plain one is nested
        b'{"mod\\u0065l": "primary", "labels": {"model": "primary"}}',
        # the value written with another escape than the compact one
        b'{"model": "prim\\u0061ry", "input": "x"}',
    ],
)
def test_forward_parses_and_dumps_when_the_bytes_leave_a_doubt(raw):
    body, model = parse_native_body(raw)
    forwarded = forward_native(raw, body, model, "/m/x")
    assert forwarded == json.dumps({**body, "model": "/m/x"}, separators=(",", ":")).encode()


@pytest.mark.parametrize("model", ["primary", "/m/x"])
def test_forward_still_refuses_a_lone_surrogate(model):
    raw = b'{"model": "%s", "input": "\\ud800"}' % model.encode()
    body, named = parse_native_body(raw)
    with pytest.raises(InvalidRequest, match="lone surrogate"):
        forward_native(raw, body, named, "/m/x")


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=12,
)
_names = st.sampled_from(["primary", "/m/x", "/m/é", 'we"ird', "model", "a\\b", "t\tab"])


@settings(max_examples=300, deadline=None)
@given(
    fields=st.dictionaries(st.text(), _json_values, max_size=4),
    at=st.integers(0, 4),
    caller=_names,
    artifact=_names,
    ensure_ascii=st.booleans(),
    spaced=st.booleans(),
)
def test_forward_and_answer_equal_a_parse_set_dump(
    fields, at, caller, artifact, ensure_ascii, spaced
):
    """Differential: whatever the bytes, the worker gets the caller's body naming the
    artifact; and an sr worker's compact answer comes back byte for byte as if parsed,
    renamed and dumped again."""
    items = [(k, v) for k, v in fields.items() if k != "model"]
    items.insert(min(at, len(items)), ("model", caller))
    separators = (", ", ": ") if spaced else (",", ":")
    raw = json.dumps(dict(items), separators=separators, ensure_ascii=ensure_ascii).encode()
    body, model = parse_native_body(raw)
    try:
        forwarded = forward_native(raw, body, model, artifact)
    except InvalidRequest:  # a lone surrogate in the caller's text
        with pytest.raises(InvalidRequest):
            json.dumps(body, ensure_ascii=False).encode()
        return
    assert json.loads(forwarded) == {**body, "model": artifact}
    worker_answer = json.dumps(
        {**body, "model": artifact}, separators=(",", ":"), ensure_ascii=False
    ).encode(errors="surrogatepass")
    expected = json.dumps({**body, "model": caller}, separators=(",", ":"), ensure_ascii=False)
    assert answer_with_public_model(worker_answer, artifact, caller) == expected.encode(
        errors="surrogatepass"
    )


def test_parse_rejects_missing_model():
    with pytest.raises(InvalidRequest, match="model"):
        parse_native_body(b"{}")


@pytest.mark.parametrize("separators", [(",", ":"), (", ", ": ")])
def test_answer_rename_fast_path(separators):
    answer = {"object": "list", "model": "/m/x", "data": [{"embedding": [1.0, 2.0]}]}
    raw = json.dumps(answer, separators=separators).encode()
    renamed = json.loads(answer_with_public_model(raw, "/m/x", "primary"))
    assert renamed == {**answer, "model": "primary"}


def test_answer_rename_leaves_nested_model_keys_alone():
    answer = {
        "model": "/m/x",
        "results": [{"label": "model", "probabilities": {"model": 0.5, "other": 0.5}}],
    }
    raw = json.dumps(answer).encode()
    renamed = json.loads(answer_with_public_model(raw, "/m/x", 'we"ird'))
    assert renamed["model"] == 'we"ird'
    assert renamed["results"] == answer["results"]


def test_answer_rename_slow_path_with_escaped_artifact():
    raw = json.dumps({"model": "/m/é"}, ensure_ascii=True).encode()
    assert json.loads(answer_with_public_model(raw, "/m/é", "p")) == {"model": "p"}


def test_answer_rename_same_name_is_identity():
    raw = b'{"model":"p"}'
    assert answer_with_public_model(raw, "p", "p") is raw
