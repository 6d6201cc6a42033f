"""CorsPolicy (sr.router.cors) and the listener setting that turns it on."""

import pytest

from sr.config.load import dump_config, parse_config
from sr.config.schema import default_config
from sr.errors import ConfigError
from sr.router.cors import CorsPolicy


def test_off_without_origins():
    policy = CorsPolicy([])
    assert not policy.enabled
    assert not policy.is_preflight("OPTIONS", b"https://a.example", b"POST")
    assert policy.answer_headers(b"https://a.example") == []


def test_listed_origin_is_allowed_and_others_are_not():
    policy = CorsPolicy(["https://a.example", "http://localhost:3000/"])
    assert policy.allows(b"https://a.example")
    assert policy.allows(b"http://localhost:3000")  # a trailing slash in the config is dropped
    assert not policy.allows(b"https://b.example")
    assert not policy.allows(b"https://a.example.evil")
    assert policy.answer_headers(b"https://b.example") == []
    headers = dict(policy.answer_headers(b"https://a.example"))
    assert headers[b"access-control-allow-origin"] == b"https://a.example"
    assert headers[b"vary"] == b"Origin"
    assert b"x-request-id" in headers[b"access-control-expose-headers"]


def test_star_allows_any_origin_and_echoes_it():
    policy = CorsPolicy(["*"])
    headers = dict(policy.answer_headers(b"https://anything.example"))
    assert headers[b"access-control-allow-origin"] == b"https://anything.example"


def test_a_preflight_needs_origin_and_requested_method():
    policy = CorsPolicy(["*"])
    assert policy.is_preflight("OPTIONS", b"https://a.example", b"POST")
    assert not policy.is_preflight("OPTIONS", None, b"POST")
    assert not policy.is_preflight("OPTIONS", b"https://a.example", None)
    assert not policy.is_preflight("POST", b"https://a.example", b"POST")
    headers = dict(policy.preflight_headers(b"authorization, content-type"))
    assert b"access-control-allow-origin" not in headers  # the answer adds the one copy
    assert headers[b"access-control-allow-methods"] == b"GET, POST, OPTIONS"
    assert headers[b"access-control-allow-headers"] == b"authorization, content-type"
    assert b"access-control-allow-credentials" not in headers


def test_the_setting_round_trips_and_is_left_out_when_empty():
    config = default_config()
    assert "cors_allow_origins" not in dump_config(config)
    config.listeners[0].cors_allow_origins = ["https://a.example", "*"]
    again = parse_config(dump_config(config))
    assert again.listeners[0].cors_allow_origins == ["https://a.example", "*"]


@pytest.mark.parametrize(
    "origin",
    ["https://a.example/path", "ftp://a.example", "a.example", "https://a:99999", "https://",
     "https://user@a.example", "https://a.example?q=1"],
)  # fmt: skip
def test_an_origin_that_is_not_one_is_a_config_error_naming_it(origin):
    config = default_config()
    config.listeners[0].cors_allow_origins = [origin]
    with pytest.raises(ConfigError) as caught:
        parse_config(dump_config(config))
    assert "listeners[0].cors_allow_origins[0]" in str(caught.value)
