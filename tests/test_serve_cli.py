"""`sr serve` argument handling end to end, up to the hand-over to the router."""

from __future__ import annotations

import io
import shutil
import socket
import sys
import types

import pytest

from sr.config.load import dump_config, parse_config
from sr.config.schema import default_config
from sr.errors import ConfigIssue
from sr.models.testing import TINY_MAX_POSITIONS
from sr.router import serve_cli

CPU_HOST = {"SR_GPU_INVENTORY": ""}
ROCM_HOST = {"SR_GPU_INVENTORY": "rocm:0,1"}


@pytest.fixture
def router(monkeypatch):
    """A stand-in for sr.router.serve that records the hand-over."""
    calls = []
    module = types.ModuleType("sr.router.serve")

    def run_sr_serve(
        config, *, config_path, host, port, threads, log_format, access_log, settings=None,
        write_config,
    ):  # fmt: skip
        write_config()  # as the router does once its listener is bound
        calls.append(
            {"config": config, "path": config_path, "host": host, "port": port, "t": threads,
             "log_format": log_format, "access_log": access_log, "settings": settings}
        )  # fmt: skip
        return 0

    module.run_sr_serve = run_sr_serve
    monkeypatch.setitem(sys.modules, "sr.router.serve", module)
    return calls


@pytest.fixture
def no_router(monkeypatch):
    monkeypatch.setitem(sys.modules, "sr.router.serve", None)  # import raises ImportError


def served_default():
    """default_config() as `sr serve` writes it: the embedded model's own input limit, 256
    (its sentence_bert_config.json's max_seq_length)."""
    cfg = default_config()
    cfg.deployments["primary"].input.max_tokens = 256
    return cfg


def serve(path, *args, env=CPU_HOST) -> int:
    return serve_cli.main([*args, "--config", str(path)], env=env)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.rstrip("\n")


def test_missing_config_is_created_and_handed_to_the_router(tmp_path, router):
    path = tmp_path / "config.yaml"
    assert serve(path, "--threads", "2") == 0
    assert path.read_text() == dump_config(served_default())
    (call,) = router
    assert call["config"] == served_default()
    assert (call["path"], call["t"]) == (path, 2)


def test_host_and_port_are_written_to_the_first_listener(tmp_path, router):
    path = tmp_path / "config.yaml"
    assert serve(path, "--host", "0.0.0.0", "--port", "9000") == 0
    (listener,) = parse_config(path.read_text()).listeners
    assert (listener.host, listener.port) == ("0.0.0.0", 9000)
    assert router[0]["config"].listeners[0] == listener
    assert serve(path) == 0  # the next start reads the same address
    assert router[1]["config"].listeners[0] == listener


def test_router_defaults_are_none(tmp_path, router):
    assert serve(tmp_path / "c.yaml") == 0
    assert (router[0]["host"], router[0]["port"], router[0]["t"]) == (None, None, None)


def test_log_format_and_access_log_reach_the_router_and_not_the_config(
    tmp_path, router, monkeypatch
):
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal: json by default
    path = tmp_path / "c.yaml"
    assert serve(path) == 0
    assert serve(path, "--log-format", "text", "--access-log") == 0
    assert serve(path, env={**CPU_HOST, "SR_LOG_FORMAT": "text"}) == 0
    assert serve(path, "--log-format", "json", env={**CPU_HOST, "SR_LOG_FORMAT": "text"}) == 0
    assert [(c["log_format"], c["access_log"]) for c in router] == [
        ("json", False),  # the access log is off unless asked for
        ("text", True),
        ("text", False),
        ("json", False),
    ]
    assert path.read_text() == dump_config(served_default())


def test_default_config_path_is_the_working_directory(tmp_path, monkeypatch, router):
    monkeypatch.chdir(tmp_path)
    assert serve_cli.main([], env=CPU_HOST) == 0
    assert (tmp_path / "config.yaml").exists()


def test_flags_are_written_to_the_config(tmp_path, router):
    path = tmp_path / "config.yaml"
    assert serve(path, "my/model", "-e", "-dp", "2", env=ROCM_HOST) == 0
    cfg = parse_config(path.read_text())
    dep = cfg.deployments["primary"]
    assert dep.artifact == "my/model" and cfg.global_.router.enabled is False
    assert [r.device for r in dep.placements()] == ["rocm:0", "rocm:1"]
    assert router[0]["config"] == cfg


def test_spec_mask_example_through_the_cli(tmp_path, router):
    path = tmp_path / "config.yaml"
    env = {"SR_GPU_INVENTORY": "rocm:0,1", "ROCR_VISIBLE_DEVICES": "7,3"}
    assert serve(path, "--device-ids", "3,7", env=env) == 0
    devices = [r.device for r in parse_config(path.read_text()).deployments["primary"].replicas]
    assert devices == ["rocm:1", "rocm:0"]


def test_unchanged_config_is_not_rewritten(tmp_path, router):
    path = tmp_path / "config.yaml"
    text = "global:\n  model_catalog:\n    deployments:\n      primary: {artifact: /m}\n"
    path.write_text(text)  # valid, not canonical: rewriting would change its bytes
    assert serve(path, "--port", "8899") == 0  # the port it has already
    assert path.read_text() == text
    assert router[0]["config"].deployments["primary"].artifact == "/m"


def test_changed_config_is_rewritten_canonically(tmp_path, router):
    path = tmp_path / "config.yaml"
    path.write_text("global:\n  model_catalog:\n    deployments:\n      primary: {artifact: /m}\n")
    assert serve(path, "-dp", "2") == 0
    assert path.read_text() == dump_config(parse_config(path.read_text()))
    assert "  - device: cpu\n          - device: cpu" in path.read_text()


def test_dry_run_prints_and_writes_nothing(tmp_path, capsys, router):
    path = tmp_path / "config.yaml"
    assert serve(path, "-dp", "3", "--dry-run") == 0
    out = capsys.readouterr().out
    assert [r.device for r in parse_config(out).deployments["primary"].replicas] == ["cpu"] * 3
    assert not path.exists() and router == []
    path.write_text(dump_config(default_config()))
    before = path.read_bytes()
    assert serve(path, "x/y", "--dry-run") == 0
    assert "artifact: x/y" in capsys.readouterr().out
    assert path.read_bytes() == before


def test_router_missing_from_the_build(tmp_path, capsys, no_router):
    path = tmp_path / "config.yaml"
    assert serve(path) == 1
    assert one_error_line(capsys) == (
        f"sr serve: config written to {path}; the router is not available in this build"
    )
    assert serve(path) == 1
    assert one_error_line(capsys) == (
        f"sr serve: config unchanged at {path}; the router is not available in this build"
    )


def test_router_exit_status_is_returned(tmp_path, monkeypatch):
    module = types.ModuleType("sr.router.serve")
    module.run_sr_serve = lambda config, **kw: 3
    monkeypatch.setitem(sys.modules, "sr.router.serve", module)
    assert serve(tmp_path / "c.yaml") == 3


# ---- usage errors: one line, exit 2, nothing written ---------------------------------

USAGE_CASES = [
    (["-dp", "0"], {}, "sr serve: error: argument -dp: must be 1..64, got 0"),
    (["-dp", "65"], {}, "sr serve: error: argument -dp: must be 1..64, got 65"),
    (["-dp", "x"], {}, "sr serve: error: argument -dp: expected an integer, got 'x'"),
    (["--bogus"], {}, "sr serve: error: unrecognized arguments: --bogus"),
    (["a", "b"], {}, "sr serve: error: unrecognized arguments: b"),
    (
        ["--platform", "tpu"],
        {},
        # argparse words the list of choices differently across Python versions
        "sr serve: error: argument --platform: invalid choice: 'tpu' (choose from ...",
    ),
    (["--port", "70000"], {}, "sr serve: error: argument --port: must be 0..65535, got 70000"),
    (["--threads", "0"], {}, "sr serve: error: argument --threads: must be 1 or more, got 0"),
    (["--host", ""], {}, "sr serve: error: argument --host: must not be empty"),
    (
        ["--log-format", "xml"],
        {},
        "sr serve: error: argument --log-format: invalid choice: 'xml' (choose from ...",
    ),
    (
        [],
        {"SR_LOG_FORMAT": "xml"},
        "sr serve: error: SR_LOG_FORMAT: must be text or json, got 'xml'",
    ),
    (
        ["--device-ids", "0,0"],
        ROCM_HOST,
        "sr serve: error: --device-ids lists 0 more than once; use -dp to repeat workers on"
        " one GPU (e.g. -dp 2 --device-ids 0)",
    ),
    (
        ["--device-ids", "0"],
        CPU_HOST,
        "sr serve: error: --device-ids requires a GPU platform: no GPU found on this host"
        " (platform cpu); pass --platform cuda|rocm or set SR_GPU_INVENTORY",
    ),
    (
        ["-dp", "4"],
        {"SR_GPU_INVENTORY": "rocm:0"},
        "sr serve: error: -dp 4 requires 4 available GPUs; use --device-ids to share a GPU"
        " (found 1: rocm:0)",
    ),
    (
        ["-dp", "3", "--device-ids", "0,1"],
        ROCM_HOST,
        "sr serve: error: -dp 3 with 2 device IDs: give one ID (all 3 workers on that GPU)"
        " or 3 IDs (one worker each)",
    ),
    (
        ["-dp", "2"],
        {"SR_GPU_INVENTORY": "tpu:0"},
        "sr serve: error: SR_GPU_INVENTORY='tpu:0': expected e.g. rocm:0,1 or cuda:0,1,2"
        " (or empty)",
    ),
]


@pytest.mark.parametrize(("args", "env", "expected"), USAGE_CASES)
def test_usage_errors_are_one_line_and_leave_the_file_alone(
    tmp_path, capsys, router, args, env, expected
):
    path = tmp_path / "config.yaml"
    path.write_text("# my config\n" + dump_config(default_config()))
    before = path.read_bytes()
    assert serve(path, *args, env=env) == 2
    line = one_error_line(capsys)
    if expected.endswith("..."):
        assert line.startswith(expected[:-3])
    else:
        assert line == expected
    assert path.read_bytes() == before
    assert router == []


@pytest.mark.parametrize(("args", "env", "expected"), USAGE_CASES[:4])
def test_usage_errors_never_create_the_file(tmp_path, capsys, router, args, env, expected):
    path = tmp_path / "config.yaml"
    assert serve(path, *args, env=env) == 2
    assert not path.exists()
    capsys.readouterr()


def test_attached_deployment_cannot_be_resized(tmp_path, capsys, router):
    path = tmp_path / "config.yaml"
    path.write_text(
        "global:\n  model_catalog:\n    deployments:\n      primary:\n        artifact: m\n"
        "        endpoint: http://10.0.0.5:8100\n        model: m\n"
    )
    before = path.read_bytes()
    assert serve(path, "-dp", "2") == 2
    assert one_error_line(capsys) == (
        "sr serve: error: deployment 'primary' has attached replicas (endpoint);"
        " -dp/--device-ids/--platform cannot change it: edit the config"
    )
    assert path.read_bytes() == before


def test_bad_yaml_reports_line_and_column_without_traceback(tmp_path, capsys, router):
    path = tmp_path / "config.yaml"
    path.write_text("global:\n  router: {enabled: true\n")
    before = path.read_bytes()
    assert serve(path) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"sr serve: error: {path}:3:1: invalid YAML:")
    assert "Traceback" not in line
    assert path.read_bytes() == before


def test_invalid_config_lists_every_issue(tmp_path, capsys, router):
    path = tmp_path / "config.yaml"
    path.write_text(
        "global:\n  model_catalog:\n    deployments:\n      primary:\n        artifact: m\n"
        "        replica: []\n        max_num_seqs: 0\n"
    )
    assert serve(path, "-dp", "2") == 2
    # a usage error is one line, so every problem shares it
    assert one_error_line(capsys) == (
        f"sr serve: error: {path}: global.model_catalog.deployments.primary.replica:"
        " unknown key; did you mean 'replicas'?;"
        " global.model_catalog.deployments.primary.max_num_seqs:"
        " must be a positive integer, got 0"
    )


def test_every_semantic_issue_shares_the_one_error_line(tmp_path, capsys, router):
    path = tmp_path / "config.yaml"
    path.write_text(
        "global:\n  model_catalog:\n    deployments:\n      primary:\n        artifact: m\n"
        "        input: {max_tokens: 1}\n        endpoint: http://127.0.0.1:9\n"
        "        model: other\n"
        "listeners:\n  - {host: 127.0.0.1, port: 8899}\n  - {host: 127.0.0.1, port: 8900}\n"
    )
    before = path.read_bytes()
    assert serve(path) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"sr serve: error: {path}: ")
    for fragment in (
        "global.model_catalog.deployments.primary.input.max_tokens: must be at least 2",
        "global.model_catalog.deployments.primary.model: attached model 'other' differs",
        "listeners: exactly one listener is supported, got 2",
    ):
        assert fragment in line
    assert path.read_bytes() == before
    assert router == []


def test_a_model_no_worker_could_take_is_refused_before_writing(tmp_path, capsys, router):
    path = tmp_path / "config.yaml"
    assert serve_cli.main(["--config", str(path), "--", "-m"], env=CPU_HOST) == 2
    assert one_error_line(capsys) == (
        "sr serve: error: the result would not validate:"
        " global.model_catalog.deployments.primary.artifact: must not start with '-', got '-m'"
    )
    assert not path.exists()


def test_issues_of_the_result_share_the_one_error_line(tmp_path, capsys, router, monkeypatch):
    two = [ConfigIssue("listeners", "first"), ConfigIssue("listeners[0].port", "second")]
    monkeypatch.setattr(serve_cli, "validate", lambda cfg: two)
    assert serve(tmp_path / "c.yaml") == 2
    assert one_error_line(capsys) == (
        "sr serve: error: the result would not validate: listeners: first;"
        " listeners[0].port: second"
    )


def test_flags_that_would_make_an_invalid_config_write_nothing(tmp_path, capsys, router):
    path = tmp_path / "config.yaml"
    path.write_text(
        "global:\n  model_catalog:\n    deployments:\n      primary:\n        artifact: m\n"
        "        replicas: [{device: cuda:0}]\n"
        "      other:\n        artifact: m\n        device: rocm:0\n"
    )
    # the file mixes platforms already; any invocation must refuse and leave it alone
    before = path.read_bytes()
    assert serve(path, "-dp", "2") == 2
    assert "one host runs one GPU platform" in capsys.readouterr().err
    assert path.read_bytes() == before


def test_write_failure_is_reported(tmp_path, capsys, monkeypatch):
    def refuse(path, cfg):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(serve_cli, "write_config_atomic", refuse)
    # The real router: it binds, then the write fails before any worker starts.
    assert serve(tmp_path / "c.yaml", "--port", "0") == 1
    assert one_error_line(capsys) == (
        f"sr serve: startup failed: cannot write {tmp_path / 'c.yaml'}: Permission denied"
    )


def test_a_port_in_use_leaves_the_config_as_it_was(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(dump_config(default_config()))
    before = path.read_bytes()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert serve(path, "-dp", "2", "--port", str(port)) == 1  # a change to write
    assert f"cannot listen on 127.0.0.1:{port}" in one_error_line(capsys)
    assert path.read_bytes() == before


def test_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as info:
        serve_cli.main(["--help"])
    assert info.value.code == 0
    assert "--device-ids" in capsys.readouterr().out


@pytest.mark.parametrize(("asked", "budget", "given"), [(64, 4, 4), (4, 4, 4), (3, 4, 3)])
def test_threads_above_the_cpu_budget_are_capped_silently(
    tmp_path, capsys, router, monkeypatch, asked, budget, given
):
    # same rule as VLLM_SRUN_CPU_THREADS : capped at the budget, no message
    monkeypatch.setattr(serve_cli, "cpu_budget", lambda: budget)
    assert serve(tmp_path / "c.yaml", "--threads", str(asked)) == 0
    assert router[0]["t"] == given
    assert capsys.readouterr().err == ""


# ---- the folder's own input limit ----------------------------------------------------


def test_an_unset_max_tokens_becomes_the_folders_own(tmp_path, router, tiny_model_dir):
    path = tmp_path / "config.yaml"
    assert serve(path, str(tiny_model_dir)) == 0  # tiny: no sentence_bert_config.json
    limits = parse_config(path.read_text()).deployments["primary"].input
    assert limits.max_tokens == TINY_MAX_POSITIONS  # the position table's length


def test_sentence_bert_config_sets_the_default_and_a_new_model_reads_its_own(
    tmp_path, router, tiny_model_dir
):
    folder = tmp_path / "st-model"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "sentence_bert_config.json").write_text('{"max_seq_length": 96}')
    path = tmp_path / "config.yaml"
    assert serve(path, str(folder)) == 0
    assert parse_config(path.read_text()).deployments["primary"].input.max_tokens == 96
    assert serve(path, str(tiny_model_dir)) == 0  # MODEL: the new folder's limit
    assert parse_config(path.read_text()).deployments["primary"].input.max_tokens == 128


def test_an_explicit_max_tokens_wins_and_one_above_the_model_is_refused(
    tmp_path, capsys, router, tiny_model_dir
):
    path = tmp_path / "config.yaml"
    text = (
        "global:\n  model_catalog:\n    deployments:\n      primary:\n"
        f"        artifact: {tiny_model_dir}\n        input: {{max_tokens: 64}}\n"
    )
    path.write_text(text)
    assert serve(path) == 0
    assert router[0]["config"].deployments["primary"].input.max_tokens == 64
    path.write_text(text.replace("64", "1000"))
    assert serve(path) == 2
    assert one_error_line(capsys) == (
        "sr serve: error: global.model_catalog.deployments.primary.input.max_tokens 1000 is"
        " above what the model takes (128 tokens, from its max_position_embeddings)"
    )
    assert "1000" in path.read_text()  # left as it was


def test_a_folder_that_does_not_resolve_keeps_max_tokens_unset(tmp_path, router):
    path = tmp_path / "config.yaml"
    assert serve(path, "/no/such/model") == 0
    assert parse_config(path.read_text()).deployments["primary"].input.max_tokens is None


def test_otlp_endpoint_turns_traces_on_for_router_and_workers(tmp_path, router):
    path = tmp_path / "config.yaml"
    assert serve(path, "--otlp-endpoint", "http://127.0.0.1:4318/") == 0
    settings = router[0]["settings"]
    assert settings.traces.endpoint == "http://127.0.0.1:4318/v1/traces"
    # the workers start with the settings' environment: the same collector
    assert settings.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == settings.traces.endpoint


def test_traces_off_by_default(tmp_path, router):
    assert serve(tmp_path / "config.yaml") == 0
    assert router[0]["settings"].traces is None


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["--otlp-endpoint", "collector:4318"], CPU_HOST,
         "sr serve: error: --otlp-endpoint: expected an http:// or https:// URL, got "
         "'collector:4318'"),
        ([], {**CPU_HOST, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
              "OTEL_TRACES_SAMPLER": "sometimes"},
         "sr serve: error: OTEL_TRACES_SAMPLER: must be one of always_on, always_off, "
         "traceidratio, parentbased_always_on, parentbased_always_off, "
         "parentbased_traceidratio, got 'sometimes'"),
    ],
)  # fmt: skip
def test_bad_trace_settings_are_one_line(tmp_path, capsys, router, args, env, expected):
    assert serve(tmp_path / "config.yaml", *args, env=env) == 2
    assert one_error_line(capsys) == expected
    assert router == []


def test_traces_without_the_otel_extra_name_it(tmp_path, capsys, router, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name.startswith("opentelemetry") else real(name, *a),
    )
    assert serve(tmp_path / "config.yaml", "--otlp-endpoint", "http://127.0.0.1:4318") == 2
    assert one_error_line(capsys) == (
        "sr serve: error: traces need the otel extra: pip install 'sr[otel]'"
    )
    assert router == []


def test_otlp_endpoint_stays_in_the_environment_a_reload_reads(tmp_path, router, monkeypatch):
    """A reload takes a new snapshot of the process's environment (sr.settings): the flag's
    endpoint must be in it, or workers started by a reload would lose their traces."""
    import os

    monkeypatch.setenv("SR_GPU_INVENTORY", "")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "placeholder")  # restored after
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    argv = ["--otlp-endpoint", "http://127.0.0.1:4318", "--config", str(tmp_path / "c.yaml")]
    assert serve_cli.main(argv) == 0
    assert os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == "http://127.0.0.1:4318/v1/traces"
