"""`discover` replica entries and attached-worker access (api_key_env, ca_bundle): the
documented YAML shape loads and round-trips; every bad value is named by its path."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sr.config.load import dump_config, parse_config, validate
from sr.config.schema import Deployment, Replica, SrConfig
from sr.errors import ConfigError

P = "global.model_catalog.deployments.primary"
MODEL = "sentence-transformers/all-MiniLM-L6-v2"

DOCUMENTED = f"""
global:
  model_catalog:
    deployments:
      primary:
        artifact: {MODEL}
        replicas:
          - discover: "dns://sr-workers.models.svc.cluster.local:8100"
            model: {MODEL}
            scheme: https
            api_key_env: SR_WORKER_API_KEY
            ca_bundle: /etc/sr/ca.pem
            refresh_s: 15
          - endpoint: https://10.0.0.5:8100
            model: {MODEL}
            api_key_env: SR_WORKER_API_KEY
            ca_bundle: /etc/sr/ca.pem
"""


def test_the_documented_shape_loads_and_round_trips():
    cfg = parse_config(DOCUMENTED)
    discovered, attached = cfg.deployments["primary"].replicas
    assert discovered == Replica(
        discover="dns://sr-workers.models.svc.cluster.local:8100",
        model=MODEL,
        scheme="https",
        api_key_env="SR_WORKER_API_KEY",
        ca_bundle="/etc/sr/ca.pem",
        refresh_s=15,
    )
    assert discovered.attached and discovered.discovered and not attached.discovered
    assert attached.api_key_env == "SR_WORKER_API_KEY"
    text = dump_config(cfg)
    assert parse_config(text) == cfg
    assert dump_config(parse_config(text)) == text
    # key order: the placement first, then how to reach it
    entry = text.index("discover:")
    assert entry < text.index("scheme:", entry) < text.index("refresh_s:", entry)


def test_defaults_stay_out_of_the_dump():
    cfg = parse_config(
        f"""
global:
  model_catalog:
    deployments:
      primary:
        artifact: {MODEL}
        replicas:
          - discover: dns://workers:8100
            model: {MODEL}
"""
    )
    (entry,) = cfg.deployments["primary"].replicas
    assert (entry.effective_scheme, entry.effective_refresh_s) == ("http", 30)
    text = dump_config(cfg)
    for key in ("scheme", "refresh_s", "api_key_env", "ca_bundle"):
        assert f"{key}:" not in text


def one(**replica) -> SrConfig:
    cfg = SrConfig()
    cfg.deployments["primary"] = Deployment(
        artifact=MODEL, replicas=[Replica(**{"model": MODEL, **replica})]
    )
    return cfg


def messages(cfg: SrConfig) -> list[str]:
    return [str(issue) for issue in validate(cfg)]


@pytest.mark.parametrize(
    ("discover", "why"),
    [
        ("dns://workers", "missing port, the port the workers listen on"),
        ("srv://workers:8100", "unknown scheme 'srv'; expected dns://HOST:PORT"),
        ("workers:8100", "unknown scheme 'workers'"),
        ("http://workers:8100", "unknown scheme 'http'"),
        ("dns://:8100", "missing host"),
        ("dns://workers:0", "port must be 1..65535"),
        ("dns://workers:99999", "Port out of range"),
        ("dns://workers:8100/path", "a path is not allowed"),
        ("dns://u:p@workers:8100", "credentials, query and fragment are not allowed"),
    ],
)
def test_a_bad_discover_name_is_named(discover, why):
    (message,) = messages(one(discover=discover))
    assert message.startswith(f"{P}.replicas[0].discover: invalid discover {discover!r}")
    assert why in message


@pytest.mark.parametrize(
    ("replica", "path", "why"),
    [
        ({"discover": "dns://w:1", "scheme": "ftp"}, "scheme", "unknown scheme 'ftp'"),
        ({"endpoint": "http://w:1", "scheme": "https"}, "scheme", "only to discover"),
        (
            {"discover": "dns://w:1", "ca_bundle": "/ca.pem"},
            "ca_bundle",
            "applies only to https workers",
        ),
        (
            {"endpoint": "http://w:1", "ca_bundle": "/ca.pem"},
            "ca_bundle",
            "applies only to https workers",
        ),
        ({"device": "cpu", "model": None, "api_key_env": "K"}, "api_key_env", "only to endpoint"),
        ({"discover": "dns://w:1", "api_key_env": "MY-KEY"}, "api_key_env", "environment var"),
        ({"discover": "dns://w:1", "refresh_s": 0}, "refresh_s", "must be 1..86400 seconds"),
        ({"endpoint": "http://w:1", "refresh_s": 5}, "refresh_s", "only to discover"),
        ({"discover": "dns://w:1", "model": None}, "model", "(discover) needs model"),
        ({"discover": "dns://w:1", "model": "other"}, "model", "differs from the deployment"),
    ],
)
def test_each_access_field_is_checked_and_named(replica, path, why):
    (message,) = messages(one(**replica))
    assert message.startswith(f"{P}.replicas[0].{path}: ")
    assert why in message


def test_discover_with_an_endpoint_is_one_too_many():
    (message,) = messages(one(discover="dns://w:1", endpoint="http://w:1"))
    assert message == (
        f"{P}.replicas[0]: a replica has one of device (managed), endpoint (attached) or"
        " discover (discovered attached workers), got endpoint and discover"
    )


def test_the_same_name_discovered_twice_is_refused():
    cfg = one(discover="dns://w:1")
    cfg.deployments["primary"].replicas.append(Replica(discover="dns://w:1", model=MODEL))
    assert messages(cfg) == [
        f"{P}.replicas[1].discover: 'dns://w:1' is discovered twice in this deployment;"
        " one entry already adds every address it resolves to"
    ]


def test_https_access_fields_validate():
    assert messages(one(discover="dns://w:1", scheme="https", ca_bundle="/ca.pem")) == []
    assert messages(one(endpoint="https://w:1", ca_bundle="/ca.pem", api_key_env="K_1")) == []


def test_yaml_types_are_checked_before_the_rules():
    with pytest.raises(ConfigError) as caught:
        parse_config(
            f"""
global:
  model_catalog:
    deployments:
      primary:
        artifact: {MODEL}
        replicas:
          - discover: dns://w:1
            model: {MODEL}
            refresh_s: "30"
"""
        )
    assert [str(i) for i in caught.value.issues] == [
        f"{P}.replicas[0].refresh_s: expected an integer, got string '30'"
    ]


hosts = st.sampled_from(["workers", "sr-workers.models.svc.cluster.local", "10.0.0.7", "[fd00::7]"])
env_names = st.from_regex(r"[A-Z_][A-Z0-9_]{0,15}", fullmatch=True)


@st.composite
def discovered_entries(draw) -> Replica:
    https = draw(st.booleans())
    return Replica(
        discover=f"dns://{draw(hosts)}:{draw(st.integers(1, 65535))}",
        model=MODEL,
        scheme=draw(st.sampled_from([None, "http"])) if not https else "https",
        api_key_env=draw(st.one_of(st.none(), env_names)),
        ca_bundle=draw(st.one_of(st.none(), st.just("/etc/sr/ca.pem"))) if https else None,
        refresh_s=draw(st.one_of(st.none(), st.integers(1, 86_400))),
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(discovered_entries(), min_size=1, max_size=3, unique_by=lambda r: r.discover))
def test_any_valid_discover_entries_round_trip(entries):
    cfg = SrConfig()
    cfg.deployments["primary"] = Deployment(artifact=MODEL, replicas=entries)
    assert validate(cfg) == []
    text = dump_config(cfg)
    assert parse_config(text) == cfg
    assert dump_config(parse_config(text)) == text
