"""`sr config show|validate`."""

from __future__ import annotations

from sr.config import cli
from sr.config.load import dump_config
from sr.config.schema import default_config


def test_show_prints_the_canonical_form(tmp_path, capsys):
    path = tmp_path / "config.yaml"
    path.write_text("global:\n  model_catalog:\n    deployments:\n      primary: {artifact: /m}\n")
    assert cli.main(["show", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "artifact: /m" in out and "listeners:\n  - host: 127.0.0.1" in out


def test_validate_ok(tmp_path, capsys):
    path = tmp_path / "config.yaml"
    path.write_text(dump_config(default_config()))
    assert cli.main(["validate", "--config", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: valid\n"


def test_validate_prints_every_issue_and_exits_2(tmp_path, capsys):
    path = tmp_path / "config.yaml"
    path.write_text(
        "global:\n  model_catalog:\n    deployments:\n      primary:\n        artifact: m\n"
        "        replicas: [{device: gpu}, {endpoint: 'http://h'}]\n"
    )
    assert cli.main(["validate", "--config", str(path)]) == 2
    prefix = f"{path}: global.model_catalog.deployments.primary.replicas"
    assert capsys.readouterr().out.splitlines() == [
        f"{prefix}[0].device: invalid device 'gpu'; expected cpu, cuda:N or rocm:N"
        " (N a GPU ordinal)",
        f"{prefix}[1].endpoint: invalid endpoint 'http://h': missing port (e.g. http://h:8100)",
        f"{prefix}[1].model: an attached replica (endpoint) needs model",
    ]


def test_validate_reports_bad_yaml_with_position(tmp_path, capsys):
    path = tmp_path / "config.yaml"
    path.write_text("global:\n  a: [1,\n")
    assert cli.main(["validate", "--config", str(path)]) == 2
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"{path}:3:1: invalid YAML:")


def test_missing_file_and_bad_arguments_are_one_line_exit_2(tmp_path, capsys):
    missing = tmp_path / "nope.yaml"
    assert cli.main(["show", "--config", str(missing)]) == 2
    assert capsys.readouterr().err == (
        f"sr config: error: no config at {missing} (sr serve creates one)\n"
    )
    assert cli.main([]) == 2
    assert capsys.readouterr().err == (
        "sr config: error: the following arguments are required: action\n"
    )
    assert cli.main(["edit"]) == 2
    assert capsys.readouterr().err.startswith(
        "sr config: error: argument action: invalid choice: 'edit'"
    )
