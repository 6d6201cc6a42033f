"""`dtype` on a deployment: default float32 (left out of the dump), validated with its path,
round-tripped, passed to managed workers as `--dtype`, and `sr serve --dtype`."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_config_roundtrip import configs

from sr.config.load import dump_config, parse_config, validate
from sr.config.schema import DTYPES, Deployment, Replica, default_config
from sr.errors import ConfigError
from sr.pool.replica import worker_argv
from sr.router import serve_cli
from sr.worker.cli import parse_args

PATH = "global.model_catalog.deployments.primary"


def _text(dtype_line: str, placement: str = "device: cpu") -> str:
    return f"""\
global:
  model_catalog:
    deployments:
      primary:
        artifact: /models/mini
{dtype_line}        {placement}
"""


def issues_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "c.yaml")
    return [str(i) for i in info.value.issues]


def test_auto_is_the_default_and_is_left_out_of_the_dump():
    cfg = default_config()
    assert cfg.deployments["primary"].dtype == "auto"
    assert "dtype" not in dump_config(cfg)
    # said explicitly, it loads the same and dumps as the default
    explicit = parse_config(_text("        dtype: auto\n"))
    assert explicit == parse_config(_text(""))
    assert "dtype" not in dump_config(explicit)
    # float32 said explicitly is kept: under throughput it differs from auto
    pinned = parse_config(_text("        dtype: float32\n"))
    assert pinned.deployments["primary"].dtype == "float32"
    assert "    dtype: float32\n" in dump_config(pinned)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_reduced_precision_round_trips(dtype):
    placement = "device: cuda:0" if dtype == "float16" else "device: cpu"
    cfg = parse_config(_text(f"        dtype: {dtype}\n", placement))
    assert cfg.deployments["primary"].dtype == dtype
    text = dump_config(cfg)
    assert f"    dtype: {dtype}\n" in text
    assert parse_config(text) == cfg and dump_config(parse_config(text)) == text
    # canonical key order: with the engine args, before the placement
    assert text.index("dtype:") < text.index("device:")


def test_unknown_dtype_is_an_error_naming_the_field():
    assert issues_of(_text("        dtype: fp8\n")) == [
        f"{PATH}.dtype: unknown dtype 'fp8'; one of auto, float32, bfloat16, float16"
    ]


def test_a_dtype_that_is_not_a_string_is_a_type_error():
    assert issues_of(_text("        dtype: 16\n")) == [
        f"{PATH}.dtype: expected a string, got int 16 (quote it to make it a string)"
    ]


def test_float16_is_refused_on_cpu_and_accepted_on_gpus_and_attached_workers():
    (issue,) = issues_of(_text("        dtype: float16\n"))
    assert issue.startswith(f"{PATH}.dtype: float16 is not served on cpu")
    assert "use bfloat16 or float32" in issue
    # the shorthand without any placement is one worker on cpu
    cfg = parse_config(_text("        dtype: bfloat16\n", "profile: exact"))
    cfg.deployments["primary"].dtype = "float16"
    assert [i.path for i in validate(cfg)] == [f"{PATH}.dtype"]
    mixed = Deployment(
        artifact="a/b", dtype="float16", replicas=[Replica(device="cuda:0"), Replica(device="cpu")]
    )
    cfg.deployments["primary"] = mixed
    assert [i.path for i in validate(cfg)] == [f"{PATH}.dtype"]
    mixed.replicas = [Replica(device="rocm:1"), Replica(endpoint="http://h:1", model="a/b")]
    assert validate(cfg) == []


def test_managed_workers_get_dtype_only_when_it_is_not_the_default():
    dep = Deployment(artifact="a/b")
    argv = worker_argv(dep, "cpu", 1, "/tmp/w.sock")
    assert "--dtype" not in argv  # auto: the worker's default, the argv of before
    assert parse_args(argv[argv.index("worker") + 1 :])[0].dtype == "auto"
    dep.dtype = "float32"  # explicit: passed, so a throughput worker serves float32
    argv = worker_argv(dep, "cpu", 1, "/tmp/w.sock")
    assert argv[argv.index("--dtype") + 1] == "float32"
    dep.dtype = "bfloat16"
    argv = worker_argv(dep, "cpu", 1, "/tmp/w.sock")
    assert argv[argv.index("--dtype") + 1] == "bfloat16"
    assert parse_args(argv[argv.index("worker") + 1 :])[0].dtype == "bfloat16"


@settings(max_examples=40, deadline=None)
@given(configs(), st.data())
def test_any_valid_dtype_round_trips_and_reaches_the_workers(cfg, data):
    for dep in cfg.deployments.values():
        on_cpu = any(r.device == "cpu" for r in dep.placements())
        dep.dtype = data.draw(st.sampled_from([d for d in DTYPES if d != "float16" or not on_cpu]))
    assert validate(cfg) == []
    text = dump_config(cfg)
    assert parse_config(text) == cfg and dump_config(parse_config(text)) == text
    for dep in cfg.deployments.values():
        for replica in dep.placements():
            if replica.device is not None:
                argv = worker_argv(dep, replica.device, 1, "/tmp/w.sock")
                assert parse_args(argv[argv.index("worker") + 1 :])[0].dtype == dep.dtype


def test_sr_serve_dtype_writes_the_default_deployment(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    assert serve_cli.main(["--config", str(path), "--dtype", "bfloat16", "--dry-run"]) == 0
    cfg = parse_config(capsys.readouterr().out)
    assert cfg.deployments["primary"].dtype == "bfloat16"
    assert not path.exists()  # --dry-run writes nothing


def test_sr_serve_refuses_float16_on_cpu_in_one_line(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(dump_config(default_config()))
    before = path.read_text()
    assert serve_cli.main(["--config", str(path), "--dtype", "float16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sr serve: error: ")
    assert f"{PATH}.dtype: float16 is not served on cpu" in err
    assert path.read_text() == before
    assert serve_cli.main(["--config", str(path), "--dtype", "fp8"]) == 2
    assert "argument --dtype: invalid choice: 'fp8'" in capsys.readouterr().err
