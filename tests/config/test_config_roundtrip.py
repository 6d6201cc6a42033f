"""Property: any valid config survives dump -> load unchanged, and its dump is a fixed point."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sr.config.load import dump_config, parse_config, validate
from sr.config.schema import (
    Deployment,
    InputLimits,
    Listener,
    OutlierDetection,
    Replica,
    SrConfig,
)

names = st.from_regex(r"[a-z][a-z0-9_-]{0,10}", fullmatch=True)
# text that YAML would read back as something else unless quoted
tricky_text = st.sampled_from(["yes", "null", "123", "1e3", "~", "a: b", "#x", "'q'", "é"])
artifacts = st.one_of(st.from_regex(r"[a-z]+/[A-Za-z0-9.-]{1,12}", fullmatch=True), tricky_text)
managed = st.builds(
    Replica, device=st.one_of(st.just("cpu"), st.integers(0, 7).map(lambda i: f"cuda:{i}"))
)
# model is filled in with the deployment's artifact: every replica serves the same model
attached = st.builds(Replica, endpoint=st.integers(1, 65535).map(lambda p: f"http://10.0.0.5:{p}"))
optional_positive = st.one_of(st.none(), st.integers(1, 10**6))


@st.composite
def deployments(draw) -> Deployment:
    base = draw(st.integers(1, 100_000))
    placement = draw(st.sampled_from(["replicas", "device", "endpoint", "none"]))
    dep = Deployment(
        artifact=draw(artifacts),
        revision=draw(st.one_of(st.none(), tricky_text)),
        profile=draw(st.sampled_from(["exact", "throughput"])),
        input=InputLimits(
            max_tokens=draw(st.integers(2, 512)),
            overflow=draw(st.sampled_from(["reject", "truncate"])),
        ),
        timeout_ms=draw(optional_positive),
        max_num_seqs=draw(optional_positive),
        max_num_batched_tokens=draw(st.one_of(st.none(), st.integers(512, 10**5))),
        outlier_detection=OutlierDetection(
            consecutive_timeouts=draw(st.integers(0, 10)),
            base_ejection_ms=base,
            max_ejection_ms=draw(st.one_of(st.none(), st.integers(base, 3_600_000))),
            max_ejection_percent=draw(st.integers(0, 100)),
        ),
    )
    if placement == "replicas":
        dep.replicas = draw(st.lists(st.one_of(managed, attached), min_size=1, max_size=5))
        for replica in dep.replicas:
            if replica.endpoint is not None:
                replica.model = dep.artifact
    elif placement == "device":
        dep.device = draw(managed).device
    elif placement == "endpoint":
        replica = draw(attached)
        dep.endpoint, dep.model = replica.endpoint, dep.artifact
    return dep


@st.composite
def configs(draw) -> SrConfig:
    cfg = SrConfig()
    deps = draw(st.dictionaries(names, deployments(), min_size=1, max_size=3))
    cfg.global_.model_catalog.deployments.update(deps)
    cfg.global_.router.enabled = draw(st.booleans())
    cfg.global_.model_catalog.system.decision_model.deployment = draw(st.sampled_from(list(deps)))
    cfg.global_.model_catalog.bindings.update(
        draw(st.dictionaries(names, st.sampled_from(list(deps)), max_size=3))
    )
    cfg.listeners = [
        Listener(port=draw(st.integers(1, 65535)), api_keys=draw(st.lists(tricky_text, max_size=2)))
    ]
    return cfg


@settings(max_examples=60, deadline=None)
@given(configs())
def test_dump_then_load_is_identity(cfg):
    assert validate(cfg) == []
    text = dump_config(cfg)
    loaded = parse_config(text)
    assert loaded == cfg
    assert dump_config(loaded) == text


@settings(max_examples=60, deadline=None)
@given(configs())
def test_a_valid_config_never_starts_workers_that_refuse_their_arguments(cfg):
    # The config mirrors every bound of `sr worker` (sr/worker/options.py); a worker that
    # refuses its argv would only show up at run time, after three restarts.
    from sr.pool.replica import worker_argv
    from sr.worker.cli import parse_args

    assert validate(cfg) == []
    for dep in cfg.deployments.values():
        for replica in dep.placements():
            if replica.device is not None:
                argv = worker_argv(dep, replica.device, 1, "/tmp/w.sock")
                options, _ = parse_args(argv[argv.index("worker") + 1 :])
                assert options.artifact == dep.artifact
