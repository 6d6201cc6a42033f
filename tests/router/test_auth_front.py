"""The router's API key check, and how a native front passes bodies through."""

from __future__ import annotations

import pytest

from sr.errors import InvalidRequest
from sr.router.auth import ApiKeyCheck
from sr.router.front import NativeFront


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


def test_a_native_request_and_its_answer_cross_untouched():
    """The worker settles `model` (sr.worker.served_as): no bytes are renamed here."""
    front = NativeFront("/v1/embeddings")
    raw = b'{ "input": ["a", "b"],\n  "model" : "primary", "k": 1 }'
    request = front.parse(raw)
    assert (request.route, request.model) == ("/v1/embeddings", "primary")
    assert request.body == {"input": ["a", "b"], "model": "primary", "k": 1}
    assert front.forward(request, raw) is raw
    answer = b'{"object":"list","model":"primary","data":[]}'
    assert front.answer(request, answer) is answer


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{}", "model: field is required"),
        (b'{"model": ""}', "model: must be a non-empty string"),
        (b'{"model": 3}', "model: must be a non-empty string"),
    ],
)
def test_parse_refuses_with_the_field_named(raw, message):
    with pytest.raises(InvalidRequest, match=message):
        NativeFront("/v1/embeddings").parse(raw)
