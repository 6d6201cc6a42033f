"""API key check and the `model` rewrite helpers."""

from __future__ import annotations

import json

import pytest

from sr.errors import InvalidRequest
from sr.router.auth import ApiKeyCheck
from sr.router.rewrite import answer_with_public_model, forward_body, parse_native_body


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
    body, model = parse_native_body(b'{"model": "primary", "input": "h\\u00e9"}')
    assert model == "primary"
    forwarded = json.loads(forward_body(body, "/m/x"))
    assert forwarded == {"model": "/m/x", "input": "hé"}
    assert body["model"] == "primary"  # the caller's body is not mutated


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
