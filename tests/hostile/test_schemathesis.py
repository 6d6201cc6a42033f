"""schemathesis, a property-based API tester, against a live `sr serve` (an embedder and a
cross-encoder, tiny BERTs) through its served `/openapi.json`, with and without API keys:
the document must be true to the server (security declared only with keys, only the routes
that exist, the error shapes each route answers, which deployment serves each body and what
it holds the body to), every schema-valid request must be accepted and every
schema-violating one refused, and no request may get a 5xx. Every check runs,
`positive_data_acceptance` included; tests/hostile/schemathesis.toml says which statuses
count as a rejection (413 too) and that a 504 answering the caller's own deadline is no
server fault. Fails on any finding."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sr.models.testing import write_tiny_bert
from tests.serve_process import ServeProcess

pytestmark = pytest.mark.e2e

SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"
CONFIG = Path(__file__).with_name("schemathesis.toml")
KEY = "sk-schemathesis-4c1d"


def _config(embedder: Path, reranker: Path, keys: list[str]) -> dict:
    return {
        "global": {
            "model_catalog": {
                "deployments": {
                    "embedder": {"artifact": str(embedder), "replicas": [{"device": "cpu"}]},
                    "reranker": {"artifact": str(reranker), "replicas": [{"device": "cpu"}]},
                },
                "system": {"decision_model": {"deployment": "embedder"}},
            }
        },
        "listeners": [{"host": "127.0.0.1", "port": 8899, "api_keys": keys}],
    }


@pytest.mark.parametrize("keys", [[], [KEY]], ids=["without-keys", "with-keys"])
def test_schemathesis_finds_nothing(tmp_path, keys):
    # Tiny models: the generator's largest bodies (2048 inputs, per-token answers) stay
    # quick, so no replica is too busy to answer its health probe.
    embedder = write_tiny_bert(tmp_path / "embedder", seed=4)
    reranker = write_tiny_bert(tmp_path / "cross-encoder", seed=5, with_head=True, labels=["s"])
    headers = {"Authorization": f"Bearer {KEY}"} if keys else {}
    (tmp_path / "serve").mkdir()
    process = ServeProcess(tmp_path / "serve", _config(embedder, reranker, keys), headers=headers)
    process.start(timeout_s=90)
    try:
        command = [
            str(SCHEMATHESIS), "--config-file", str(CONFIG), "run", f"{process.url}/openapi.json",
            "--checks", "all",
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
