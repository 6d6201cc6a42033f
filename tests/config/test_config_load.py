"""Loading and dumping the canonical config: round trip, types, unknown keys, YAML errors."""

from __future__ import annotations

import os
import stat

import pytest

from sr.config.load import dump_config, load_config, parse_config, write_config_atomic
from sr.config.schema import (
    Deployment,
    Listener,
    OutlierDetection,
    Replica,
    SrConfig,
    default_config,
)
from sr.errors import ConfigError

# A full config in canonical form: null fields left out, block style, keys in schema order.
CANONICAL = """\
global:
  router:
    enabled: false
  model_catalog:
    deployments:
      primary:
        provider: model_runtime
        artifact: sentence-transformers/all-MiniLM-L6-v2
        revision: 3b3d9b6
        profile: exact
        input:
          max_tokens: 256
          overflow: reject
        timeout_ms: 10000
        max_num_seqs: 64
        max_num_batched_tokens: 8192
        replicas:
          - device: cpu
          - device: cpu
          - endpoint: http://10.0.0.5:8100
            model: sentence-transformers/all-MiniLM-L6-v2
        outlier_detection:
          consecutive_timeouts: 3
          base_ejection_ms: 30000
          max_ejection_ms: 300000
          max_ejection_percent: 50
    bindings:
      intent: primary
    system:
      decision_model:
        deployment: primary
listeners:
  - host: 127.0.0.1
    port: 8899
    api_keys:
      - secret-1
"""

MINIMAL = """\
global:
  model_catalog:
    deployments:
      primary:
        artifact: /models/mini
"""


def issues_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "c.yaml")
    return [str(i) for i in info.value.issues]


def test_canonical_text_round_trips_byte_for_byte():
    cfg = parse_config(CANONICAL)
    assert dump_config(cfg) == CANONICAL


def test_canonical_object_round_trips():
    cfg = parse_config(CANONICAL)
    assert parse_config(dump_config(cfg)) == cfg
    assert parse_config(dump_config(default_config())) == default_config()


def test_loaded_values_and_global_key():
    cfg = parse_config(CANONICAL)
    dep = cfg.deployments["primary"]
    assert cfg.global_.router.enabled is False
    assert dep.revision == "3b3d9b6" and dep.max_num_batched_tokens == 8192
    assert dep.placements()[2] == Replica(
        endpoint="http://10.0.0.5:8100", model="sentence-transformers/all-MiniLM-L6-v2"
    )
    assert cfg.listeners == [Listener(api_keys=["secret-1"])]
    assert "global_" not in dump_config(cfg)


def test_missing_sections_take_defaults_and_dump_is_explicit():
    cfg = parse_config(MINIMAL)
    dep = cfg.deployments["primary"]
    assert dep.outlier_detection == OutlierDetection()
    assert dep.placements() == [Replica(device="cpu")]
    assert cfg.listeners == [Listener()]
    text = dump_config(cfg)
    assert "revision" not in text and "replicas" not in text and "max_ejection_ms" not in text
    assert parse_config(text) == cfg


def test_shorthand_and_one_explicit_replica_have_the_same_placements():
    shorthand = parse_config(MINIMAL.replace("/models/mini", "/m\n        device: cuda:0"))
    explicit = parse_config(
        MINIMAL.replace("/models/mini", "/m\n        replicas: [{device: cuda:0}]")
    )
    assert shorthand.deployments["primary"].placements() == [Replica(device="cuda:0")]
    assert (
        shorthand.deployments["primary"].placements()
        == explicit.deployments["primary"].placements()
    )
    attached = Deployment(artifact="a", endpoint="http://h:1", model="a")
    assert attached.placements() == [Replica(endpoint="http://h:1", model="a")]


def test_dump_key_order_follows_the_spec():
    text = dump_config(parse_config(CANONICAL))
    keys = [
        "provider:",
        "artifact:",
        "revision:",
        "profile:",
        "input:",
        "timeout_ms:",
        "max_num_seqs:",
        "max_num_batched_tokens:",
        "replicas:",
        "outlier_detection:",
    ]
    positions = [text.index(k) for k in keys]
    assert positions == sorted(positions)
    assert text.index("global:") < text.index("listeners:")


def test_unknown_key_suggests_the_close_match():
    text = MINIMAL + "        replica: []\n"
    assert issues_of(text) == [
        "global.model_catalog.deployments.primary.replica: unknown key; did you mean 'replicas'?"
    ]


def test_unknown_key_without_close_match_lists_known_keys():
    (issue,) = issues_of(MINIMAL + "zzz: 1\n")
    assert issue == "zzz: unknown key; known keys: global, listeners"


def test_wrong_types_are_reported_with_paths_all_at_once():
    text = """\
global:
  router: {enabled: "no"}
  model_catalog:
    deployments:
      primary:
        artifact: a
        timeout_ms: "5"
        revision: 1234
        replicas: [5, {device: cpu}]
listeners:
  - {host: h, port: true, api_keys: [1]}
"""
    assert issues_of(text) == [
        "global.router.enabled: expected true or false, got string 'no'",
        "global.model_catalog.deployments.primary.timeout_ms: expected an integer, got string '5'",
        "global.model_catalog.deployments.primary.revision: expected a string, got int 1234"
        " (quote it to make it a string)",
        "global.model_catalog.deployments.primary.replicas[0]: expected a mapping, got int 5",
        "listeners[0].port: expected an integer, got boolean true",
        "listeners[0].api_keys[0]: expected a string, got int 1 (quote it to make it a string)",
    ]


def test_missing_required_artifact():
    assert issues_of("global: {model_catalog: {deployments: {primary: {}}}}") == [
        "global.model_catalog.deployments.primary.artifact: missing required key"
    ]


def test_shape_and_semantic_errors_are_reported_together():
    text = MINIMAL + "        max_num_seqs: 0\n        profil: exact\n"
    assert issues_of(text) == [
        "global.model_catalog.deployments.primary.profil: unknown key; did you mean 'profile'?",
        "global.model_catalog.deployments.primary.max_num_seqs: must be a positive integer, got 0",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "the config is empty; expected a mapping with 'global'"),
        ("- 1\n", "the config must be a mapping, got a list"),
        ("global: {}\nglobal: {}\n", "c.yaml:2:1: invalid YAML: duplicate key 'global'"),
        (
            "global: [\n",
            "c.yaml:2:1: invalid YAML: expected the node content, but found '<stream end>'",
        ),
        (
            "global:\n  a: 1\n\tb: 2\n",
            "c.yaml:3:1: invalid YAML: found character '\\t' that cannot start any token",
        ),
    ],
)
def test_document_level_errors(text, expected):
    assert issues_of(text) == [expected]


def test_duplicate_deployment_name_is_an_error():
    text = MINIMAL + "      primary:\n        artifact: b\n"
    (issue,) = issues_of(text)
    assert issue.startswith("c.yaml:6:7: invalid YAML: duplicate key 'primary'")


def test_load_config_reads_files_and_reports_unreadable_ones(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(CANONICAL)
    assert load_config(path) == parse_config(CANONICAL)
    with pytest.raises(ConfigError, match=r"cannot read .*missing.yaml: No such file"):
        load_config(tmp_path / "missing.yaml")
    path.write_text("global: [\n")
    with pytest.raises(ConfigError, match=r"config.yaml:2:1: invalid YAML"):
        load_config(path)


def test_write_config_atomic_replaces_and_keeps_mode(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("old")
    os.chmod(path, 0o600)
    cfg = default_config()
    write_config_atomic(path, cfg)
    assert path.read_text() == dump_config(cfg)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]  # no temp left


def test_write_config_atomic_creates_a_new_file(tmp_path):
    path = tmp_path / "new.yaml"
    write_config_atomic(path, SrConfig(listeners=[Listener(port=9000)]))
    assert "port: 9000" in path.read_text()


def test_write_config_atomic_leaves_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    path = tmp_path / "config.yaml"
    path.write_text("old")

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        write_config_atomic(path, default_config())
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_write_config_atomic_writes_through_a_symlink(tmp_path):
    target = tmp_path / "real" / "config.yaml"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "config.yaml"
    link.symlink_to(target)
    write_config_atomic(link, default_config())
    assert link.is_symlink()
    assert target.read_text() == dump_config(default_config())
