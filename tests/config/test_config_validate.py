"""Semantic validation: each rule, its path and its message."""

from __future__ import annotations

import pytest

from sr.config.load import validate
from sr.config.schema import (
    Deployment,
    Listener,
    OutlierDetection,
    Replica,
    SrConfig,
    default_config,
)
from sr.config.validate import device_error, endpoint_error

P = "global.model_catalog.deployments.primary"


def with_primary(**kwargs) -> SrConfig:
    cfg = SrConfig()
    cfg.deployments["primary"] = Deployment(artifact=kwargs.pop("artifact", "a"), **kwargs)
    return cfg


def messages(cfg: SrConfig) -> list[str]:
    return [str(i) for i in validate(cfg)]


def test_default_config_is_valid():
    assert validate(default_config()) == []


@pytest.mark.parametrize("device", ["cpu", "cuda:0", "rocm:7", "cuda:12"])
def test_good_devices(device):
    assert device_error(device) is None


@pytest.mark.parametrize(
    "device",
    ["gpu", "cuda", "cuda:", "cuda:-1", "cuda:01", "rocm:x", "CPU", "cpu:0", "mps:0", " cpu"],
)
def test_bad_devices(device):
    assert device_error(device) == (
        f"invalid device {device!r}; expected cpu, cuda:N or rocm:N (N a GPU ordinal)"
    )


def test_bad_device_in_a_replica_has_its_path():
    cfg = with_primary(replicas=[Replica(device="cpu"), Replica(device="cuda")])
    assert messages(cfg) == [
        f"{P}.replicas[1].device: invalid device 'cuda'; expected cpu, cuda:N or rocm:N"
        " (N a GPU ordinal)"
    ]


@pytest.mark.parametrize(
    "url",
    ["http://10.0.0.5:8100", "https://w.example:443/", "http://[::1]:9000", "http://h:1/prefix"],
)
def test_good_endpoints(url):
    assert endpoint_error(url) is None


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://h:1", "; expected http://HOST:PORT or https://HOST:PORT"),
        ("10.0.0.5:8100", "; expected http://HOST:PORT or https://HOST:PORT"),
        ("http://:8100", ": missing host"),
        ("http://h", ": missing port (e.g. http://h:8100)"),
        ("http://h:0", ": port must be 1..65535"),
        ("http://h:99999", ": Port out of range 0-65535"),
        ("http://u:p@h:1", ": credentials, query and fragment are not allowed"),
        ("http://h:1/?a=1", ": credentials, query and fragment are not allowed"),
    ],
)
def test_bad_endpoints(url, why):
    assert endpoint_error(url) == f"invalid endpoint {url!r}{why}"


def test_replica_with_both_device_and_endpoint():
    cfg = with_primary(replicas=[Replica(device="cpu", endpoint="http://h:1", model="a")])
    assert messages(cfg) == [
        f"{P}.replicas[0]: a replica has either device (managed) or endpoint (attached), not both"
    ]


def test_replica_with_neither():
    assert messages(with_primary(replicas=[Replica()])) == [
        f"{P}.replicas[0]: a replica needs device (managed) or endpoint + model (attached)"
    ]


def test_endpoint_without_model():
    assert messages(with_primary(replicas=[Replica(endpoint="http://h:1")])) == [
        f"{P}.replicas[0].model: an attached replica (endpoint) needs model"
    ]
    assert messages(with_primary(endpoint="http://h:1")) == [
        f"{P}.model: an attached replica (endpoint) needs model"
    ]


def test_attached_replica_must_serve_the_deployment_artifact():
    cfg = with_primary(
        artifact="a",
        replicas=[
            Replica(device="cpu"),
            Replica(endpoint="http://127.0.0.1:9", model="some/other"),
        ],
    )
    assert messages(cfg) == [
        f"{P}.replicas[1].model: attached model 'some/other' differs from the deployment's"
        " artifact 'a'; all replicas of a deployment share the artifact"
    ]


def test_attached_shorthand_must_serve_the_deployment_artifact():
    assert messages(with_primary(artifact="a", endpoint="http://h:1", model="b")) == [
        f"{P}.model: attached model 'b' differs from the deployment's artifact 'a';"
        " all replicas of a deployment share the artifact"
    ]


def test_model_on_a_managed_replica():
    assert messages(with_primary(replicas=[Replica(device="cpu", model="a")])) == [
        f"{P}.replicas[0].model: model applies only to an attached replica (endpoint)"
    ]


def test_shorthand_device_and_endpoint_are_checked_at_deployment_level():
    assert messages(with_primary(device="gpu:0")) == [
        f"{P}.device: invalid device 'gpu:0'; expected cpu, cuda:N or rocm:N (N a GPU ordinal)"
    ]
    assert messages(with_primary(device="cpu", endpoint="http://h:1", model="a")) == [
        f"{P}: a replica has either device (managed) or endpoint (attached), not both"
    ]
    assert validate(with_primary(endpoint="http://h:1", model="a")) == []


@pytest.mark.parametrize("key", ["device", "endpoint", "model"])
def test_replicas_cannot_be_combined_with_deployment_level_placement(key):
    value = {"device": "cpu", "endpoint": "http://h:1", "model": "a"}[key]
    cfg = with_primary(replicas=[Replica(device="cpu")], **{key: value})
    assert messages(cfg) == [
        f"{P}.{key}: deployment-level {key} cannot be combined with replicas;"
        " move it into a replica"
    ]


def test_replica_count_limits():
    assert messages(with_primary(replicas=[])) == [f"{P}.replicas: must list at least one replica"]
    assert validate(with_primary(replicas=[Replica(device="cpu")] * 64)) == []
    assert messages(with_primary(replicas=[Replica(device="cpu")] * 65)) == [
        f"{P}.replicas: at most 64 replicas per deployment, got 65"
    ]


@pytest.mark.parametrize("field", ["timeout_ms", "max_num_seqs", "max_num_batched_tokens"])
@pytest.mark.parametrize("value", [0, -5])
def test_limits_must_be_positive(field, value):
    assert messages(with_primary(**{field: value})) == [
        f"{P}.{field}: must be a positive integer, got {value}"
    ]


def test_input_limits():
    cfg = with_primary()
    cfg.deployments["primary"].input.max_tokens = 0
    cfg.deployments["primary"].input.overflow = "drop"
    assert messages(cfg) == [
        f"{P}.input.max_tokens: must be at least 2 (workers refuse fewer), got 0",
        f"{P}.input.overflow: unknown overflow 'drop'; one of reject, truncate",
    ]


def test_max_tokens_of_one_is_refused_like_the_worker_refuses_it():
    cfg = with_primary()
    cfg.deployments["primary"].input.max_tokens = 1
    assert messages(cfg) == [
        f"{P}.input.max_tokens: must be at least 2 (workers refuse fewer), got 1"
    ]
    cfg.deployments["primary"].input.max_tokens = 2
    assert validate(cfg) == []


@pytest.mark.parametrize("field", ["artifact", "revision"])
@pytest.mark.parametrize(
    ("value", "why"),
    [("-m", "must not start with '-', got '-m'"), ("a\0b", "must not contain a NUL character")],
)
def test_artifact_and_revision_must_survive_the_worker_command_line(field, value, why):
    assert messages(with_primary(**{field: value})) == [f"{P}.{field}: {why}"]


def test_batched_token_budget_must_fit_one_full_input():
    assert messages(with_primary(max_num_batched_tokens=100)) == []  # the worker checks it
    cfg = with_primary(max_num_batched_tokens=100)
    cfg.deployments["primary"].input.max_tokens = 256
    assert messages(cfg) == [
        f"{P}.max_num_batched_tokens: must be at least input.max_tokens (256) so that one"
        " full-length input fits a batch, got 100"
    ]


def test_provider_profile_and_artifact():
    cfg = with_primary(artifact=" ", provider="vllm", profile="fast")
    assert messages(cfg) == [
        f"{P}.provider: unknown provider 'vllm'; use model_runtime",
        f"{P}.artifact: must not be empty",
        f"{P}.profile: unknown profile 'fast'; one of exact, throughput",
    ]


def test_outlier_detection_rules():
    od = f"{P}.outlier_detection"
    cases = [
        (
            OutlierDetection(consecutive_timeouts=-1),
            f"{od}.consecutive_timeouts: must be 0 (ejection off) or more, got -1",
        ),
        (OutlierDetection(base_ejection_ms=0), f"{od}.base_ejection_ms: must be 1..3600000, got 0"),
        (
            OutlierDetection(base_ejection_ms=1000, max_ejection_ms=999),
            f"{od}.max_ejection_ms: must be at least base_ejection_ms (1000), got 999",
        ),
        (
            OutlierDetection(max_ejection_ms=3_600_001),
            f"{od}.max_ejection_ms: must be at most 3600000 (one hour), got 3600001",
        ),
        (
            OutlierDetection(max_ejection_percent=101),
            f"{od}.max_ejection_percent: must be 0..100, got 101",
        ),
    ]
    for outlier, expected in cases:
        assert messages(with_primary(outlier_detection=outlier)) == [expected]
    assert validate(with_primary(outlier_detection=OutlierDetection(consecutive_timeouts=0))) == []
    assert OutlierDetection(base_ejection_ms=1000).effective_max_ejection_ms == 10_000
    assert OutlierDetection(base_ejection_ms=3_000_000).effective_max_ejection_ms == 3_600_000


def test_decision_model_must_name_a_deployment():
    cfg = with_primary()
    cfg.global_.model_catalog.system.decision_model.deployment = "other"
    assert messages(cfg) == [
        "global.model_catalog.system.decision_model.deployment: unknown deployment 'other';"
        " known: primary"
    ]


def test_bindings_must_name_deployments():
    cfg = with_primary()
    cfg.global_.model_catalog.bindings.update({"intent": "primary", "pii": "nope"})
    assert messages(cfg) == [
        "global.model_catalog.bindings.pii: unknown deployment 'nope'; known: primary"
    ]


def test_at_least_one_deployment():
    assert messages(SrConfig()) == [
        "global.model_catalog.deployments: at least one deployment is required"
    ]


@pytest.mark.parametrize("name", ["", "a b", "-x", "a/b", "x" * 65])
def test_deployment_names_are_plain(name):
    cfg = with_primary()
    cfg.deployments[name] = cfg.deployments.pop("primary")
    cfg.global_.model_catalog.system.decision_model.deployment = name
    assert messages(cfg) == [
        f"global.model_catalog.deployments.{name}: deployment names are 1-64 letters, digits,"
        " '.', '_' or '-', starting with a letter or digit"
    ]


def test_one_gpu_platform_per_host():
    cfg = with_primary(replicas=[Replica(device="cuda:0"), Replica(device="rocm:0")])
    assert messages(cfg) == [
        "global.model_catalog.deployments: managed replicas mix cuda and rocm devices;"
        " one host runs one GPU platform"
    ]
    # attached replicas run elsewhere and do not count
    cfg = with_primary(
        replicas=[Replica(device="cuda:0"), Replica(endpoint="http://h:1", model="a")]
    )
    assert validate(cfg) == []


def test_listener_rules():
    cfg = with_primary()
    cfg.listeners = [Listener(host="", port=70000, api_keys=["ok", " "])]
    assert messages(cfg) == [
        "listeners[0].host: must not be empty",
        "listeners[0].port: must be 0..65535, got 70000",
        "listeners[0].api_keys[1]: api keys must not be empty",
    ]
    cfg.listeners = [Listener(port=0)]  # the OS picks a free port
    assert validate(cfg) == []


@pytest.mark.parametrize("count", [0, 2, 3])
def test_exactly_one_listener(count):
    # the router serves listeners[0] only, so exactly one is allowed: others would be ignored,
    # and none would silently serve 127.0.0.1:8899 without the api_keys the file used to list
    cfg = with_primary()
    cfg.listeners = [Listener(port=9000 + i) for i in range(count)]
    assert messages(cfg) == [f"listeners: exactly one listener is supported, got {count}"]


def test_more_listeners_still_get_their_own_checks():
    cfg = with_primary()
    cfg.listeners = [Listener(), Listener(port=-1)]
    assert messages(cfg) == [
        "listeners: exactly one listener is supported, got 2",
        "listeners[1].port: must be 0..65535, got -1",
    ]


def test_every_issue_is_collected():
    cfg = with_primary(max_num_seqs=0, replicas=[Replica(), Replica(device="x")])
    cfg.global_.model_catalog.bindings["b"] = "nope"
    assert len(validate(cfg)) == 4


def test_configs_built_in_python_get_the_type_checks_of_a_file():
    cfg = with_primary(timeout_ms="10s")
    cfg.listeners = [Listener(port="8899")]
    assert messages(cfg) == [
        f"{P}.timeout_ms: expected an integer, got string '10s'",
        "listeners[0].port: expected an integer, got string '8899'",
    ]


def test_a_malformed_object_is_an_issue_not_a_crash():
    cfg = with_primary(replicas=[{"device": "cpu"}])
    (issue,) = validate(cfg)
    assert issue.path == "" and issue.message.startswith("malformed config object:")


@pytest.mark.parametrize(
    "name", ["*", "sr.internal", "sr-router.svc.cluster.local.", "10.0.0.7", "[fd00::7]", "my_host"]
)
def test_allowed_hosts_take_host_names(name):
    cfg = default_config()
    cfg.listeners[0].allowed_hosts = [name]
    assert validate(cfg) == []


@pytest.mark.parametrize(
    "name", ["", " ", "https://sr.internal", "sr.internal:8899", "a b", "sr/x", "-bad.example"]
)
def test_allowed_hosts_refuse_what_a_host_header_could_never_match(name):
    cfg = default_config()
    cfg.listeners[0].allowed_hosts = ["ok.example", name]
    (issue,) = messages(cfg)
    assert issue.startswith("listeners[0].allowed_hosts[1]: expected")
    assert repr(name) in issue
