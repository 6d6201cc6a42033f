"""schemathesis, a property-based API tester, against a live `sr serve` (an embedder and a
cross-encoder) through its served `/openapi.json`, with and without API keys: the document
must be true to the server (security declared only with keys, only the routes that exist,
the error shapes each route answers), and no request may get a 5xx. Fails on any finding.

Every check runs but `positive_data_acceptance`: the document cannot yet state every
constraint the server holds a schema-valid body to (which deployment serves which route,
text that is not all whitespace, ids below the vocabulary size, a deadline long enough to
answer in); docs/clients.md lists them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sr.models.artifacts import EMBEDDED_DEFAULT
from sr.models.testing import write_tiny_bert
from tests.serve_process import ServeProcess

pytestmark = pytest.mark.e2e

SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"
KEY = "sk-schemathesis-4c1d"


def _config(folder: Path, keys: list[str]) -> dict:
    return {
        "global": {
            "model_catalog": {
                "deployments": {
                    "embedder": {"artifact": EMBEDDED_DEFAULT, "replicas": [{"device": "cpu"}]},
                    "reranker": {"artifact": str(folder), "replicas": [{"device": "cpu"}]},
                },
                "system": {"decision_model": {"deployment": "embedder"}},
            }
        },
        "listeners": [{"host": "127.0.0.1", "port": 8899, "api_keys": keys}],
    }


@pytest.mark.parametrize("keys", [[], [KEY]], ids=["without-keys", "with-keys"])
def test_schemathesis_finds_nothing(tmp_path, keys):
    folder = write_tiny_bert(tmp_path / "cross-encoder", seed=5, with_head=True, labels=["s"])
    headers = {"Authorization": f"Bearer {KEY}"} if keys else {}
    (tmp_path / "serve").mkdir()
    process = ServeProcess(tmp_path / "serve", _config(folder, keys), headers=headers)
    process.start(timeout_s=90)
    try:
        command = [
            str(SCHEMATHESIS), "run", f"{process.url}/openapi.json",
            "--checks", "all", "--exclude-checks", "positive_data_acceptance",
            "--max-examples", "20", "--seed", "20261205", "--workers", "1",
            "--request-timeout", "20", "--no-color",
        ]  # fmt: skip
        if keys:
            command += ["--header", f"Authorization: Bearer {KEY}"]
        # Run in tmp_path: schemathesis keeps a cache folder in its working directory.
        run = subprocess.run(command, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    finally:
        process.stop()
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "passed" in run.stdout
