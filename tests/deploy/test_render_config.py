"""deploy/k8s/common/render_config.py: the init container that adds the Secret's API keys to
the ConfigMap's config. The result is read back with sr's own loader."""

from __future__ import annotations

import stat
import subprocess
import sys

from sr.config.load import dump_config, load_config
from tests.deploy.render_config_module import SCRIPT, render_config

CONFIG = """\
global:
  model_catalog:
    deployments:
      primary:
        artifact: sentence-transformers/all-MiniLM-L6-v2
        replicas:
          - device: cpu
listeners:
  - host: {host}
    port: 8899
"""


def _source(tmp_path, host="0.0.0.0"):
    path = tmp_path / "source.yaml"
    path.write_text(CONFIG.format(host=host))
    return path


def test_keys_from_the_environment_are_written_0600_in_canonical_form(tmp_path):
    target = tmp_path / "run" / "config.yaml"
    target.parent.mkdir()
    count = render_config.render(
        str(_source(tmp_path)), str(target), {"SR_API_KEYS": " new-key , old-key ,, "}
    )
    assert count == 2
    config = load_config(target)
    assert config.listeners[0].api_keys == ["new-key", "old-key"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    # Canonical: `sr serve` compares and finds nothing to rewrite on a read-only mount.
    assert target.read_text() == dump_config(config)


def test_a_public_listener_without_a_key_is_refused_and_nothing_is_written(tmp_path):
    target = tmp_path / "config.yaml"
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(_source(tmp_path)), str(target)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"SR_API_KEYS": " , "},
        check=False,
    )
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        "render_config: listeners[0].host is '0.0.0.0' and there is no API key: "
        "set SR_API_KEYS (from the Secret) or api_keys in the config"
    ]
    assert not target.exists()


def test_a_loopback_listener_may_go_without_a_key(tmp_path):
    target = tmp_path / "config.yaml"
    for host in ("127.0.0.1", "::1", "localhost"):
        source = _source(tmp_path, host)
        assert render_config.render(str(source), str(target), {}) == 0


def test_an_invalid_config_is_one_line_naming_the_field(tmp_path, capsys):
    source = tmp_path / "source.yaml"
    source.write_text(CONFIG.format(host="0.0.0.0").replace("device: cpu", "devise: cpu"))
    target = tmp_path / "config.yaml"
    code = render_config.main(["render_config.py", str(source), str(target)])
    assert code == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"render_config: {source}: ")
    assert "replicas[0]" in line and "devise" in line
    assert not target.exists()
