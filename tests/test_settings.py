"""sr.settings: the environment read once, validated with a one-line error, handed down."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import sr
from sr.errors import UsageError
from sr.router import serve_cli
from sr.settings import (
    DEFAULT_RESULT_CACHE_ENTRIES,
    ModelSources,
    Settings,
    fault_injection_enabled,
    parse_duration,
    result_cache_entries_from_env,
)
from sr.worker import cli as worker_cli

SR_ROOT = Path(sr.__file__).parent

MALFORMED = [
    ("VLLM_SRUN_READY_TIMEOUT", "soon"),
    ("VLLM_SRUN_RESULT_CACHE", "lots"),
    ("VLLM_SRUN_CPU_THREADS", "0"),
    ("VLLM_SRUN_CPU_ADAPTIVE_THREADS", "3"),
    ("SR_LOG_FORMAT", "xml"),
]


def test_defaults_when_nothing_is_set():
    settings = Settings.from_environ({})
    assert settings.ready_timeout_s == 600
    assert settings.result_cache_entries == 4096
    assert settings.worker_threads is None
    assert settings.adaptive_threads == 0
    assert settings.fault_injection is False
    assert settings.inventory_api_key is None


def test_values_are_parsed():
    settings = Settings.from_environ(
        {
            "VLLM_SRUN_READY_TIMEOUT": "90s",
            "VLLM_SRUN_RESULT_CACHE": "0",
            "VLLM_SRUN_CPU_THREADS": " 3 ",
            "VLLM_SRUN_CPU_ADAPTIVE_THREADS": "2",
            "SR_FAULT_INJECTION": "1",
            "SR_API_KEY": "secret-key",
        }
    )
    assert (settings.ready_timeout_s, settings.result_cache_entries) == (90, 0)
    assert (settings.worker_threads, settings.adaptive_threads) == (3, 2)
    assert settings.fault_injection and settings.inventory_api_key == "secret-key"
    assert "secret-key" not in repr(settings)  # keys stay out of logs and tracebacks


@pytest.mark.parametrize(("name", "value"), MALFORMED)
def test_a_malformed_variable_is_one_usage_error_naming_it(name, value):
    with pytest.raises(UsageError, match=name) as caught:
        Settings.from_environ({name: value})
    assert "\n" not in str(caught.value)


def test_the_snapshot_does_not_follow_the_mapping_it_was_taken_from():
    environ = {"SR_MODEL_DIR": "/models"}
    settings = Settings.from_environ(environ)
    environ["SR_MODEL_DIR"] = "/elsewhere"
    assert settings.environ["SR_MODEL_DIR"] == "/models"
    assert settings.models.model_dir == "/models"
    with pytest.raises(TypeError):
        settings.environ["SR_MODEL_DIR"] = "/x"  # type: ignore[index]


def test_model_sources_follow_huggingface_hubs_precedence(tmp_path):
    home = ModelSources.from_environ({"HF_HOME": str(tmp_path)})
    assert home.hub_cache == tmp_path / "hub"
    both = ModelSources.from_environ({"HF_HOME": "/h", "HF_HUB_CACHE": str(tmp_path / "c")})
    assert both.hub_cache == tmp_path / "c"
    hub = ModelSources.from_environ(
        {"HF_ENDPOINT": " https://hub.example/ ", "HF_HUB_OFFLINE": "1"}
    )
    assert (hub.hf_endpoint, hub.offline_variable) == ("https://hub.example", "HF_HUB_OFFLINE")
    assert ModelSources.from_environ({"TRANSFORMERS_OFFLINE": "no"}).offline_variable is None


@pytest.mark.parametrize(("name", "value"), MALFORMED)
def test_sr_serve_exits_2_with_one_line_before_reading_its_config(name, value, tmp_path, capsys):
    path = tmp_path / "config.yaml"
    env = {"SR_GPU_INVENTORY": "", name: value}
    assert serve_cli.main(["--dry-run", "--config", str(path)], env=env) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sr serve: error: ") and name in err
    assert not path.exists()


@pytest.mark.parametrize(("name", "value"), MALFORMED)
def test_sr_worker_exits_2_with_one_line(name, value, monkeypatch, capsys):
    monkeypatch.setenv(name, value)
    assert worker_cli.main(["--artifact", "org/m", "--uds", "/nonexistent/w.sock"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sr worker: ") and name in err


def test_no_module_but_sr_settings_reads_the_environment():
    readers = re.compile(r"\bos\.environ\b|\bgetenv\(|\bfrom os import environ\b")
    found = [
        f"{path.relative_to(SR_ROOT)}:{number}"
        for path in sorted(SR_ROOT.rglob("*.py"))
        if path.name != "settings.py" or path.parent != SR_ROOT
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if readers.search(line)
    ]
    assert found == []


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90), ("10m", 600), ("1h", 3600), ("250ms", 0.25), ("5", 5)]
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "10x", "-1s", "0s", "m"])
def test_parse_duration_rejects(text):
    with pytest.raises(UsageError, match=r"duration|greater than zero"):
        parse_duration(text)


def ready_timeout_s(environ: dict[str, str]) -> float:
    return Settings.from_environ(environ).ready_timeout_s


def test_ready_timeout_default_and_env():
    assert ready_timeout_s({}) == 600
    assert ready_timeout_s({"VLLM_SRUN_READY_TIMEOUT": "90s"}) == 90
    with pytest.raises(UsageError, match="VLLM_SRUN_READY_TIMEOUT"):
        ready_timeout_s({"VLLM_SRUN_READY_TIMEOUT": "soon"})


@pytest.mark.parametrize(
    ("value", "entries"),
    [(None, DEFAULT_RESULT_CACHE_ENTRIES), ("", DEFAULT_RESULT_CACHE_ENTRIES), ("0", 0),
     ("17", 17), (" 5 ", 5)],
)  # fmt: skip
def test_env_values(value, entries):
    environ = {} if value is None else {"VLLM_SRUN_RESULT_CACHE": value}
    assert result_cache_entries_from_env(environ) == entries


@pytest.mark.parametrize("value", ["-1", "many", "1.5", "1e3"])
def test_bad_env_values_are_config_errors(value):
    with pytest.raises(UsageError, match="VLLM_SRUN_RESULT_CACHE must be"):
        result_cache_entries_from_env({"VLLM_SRUN_RESULT_CACHE": value})


def test_enabled_only_by_exactly_one():
    assert fault_injection_enabled({"SR_FAULT_INJECTION": "1"})
    for value in ("0", "", "true", "yes"):
        assert not fault_injection_enabled({"SR_FAULT_INJECTION": value})
    assert not fault_injection_enabled({})
