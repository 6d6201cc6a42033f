"""The README's first command: `sr serve` with no config serves the embedded MiniLM."""

from __future__ import annotations

import json
import math
from importlib import resources

import pytest
import yaml

from tests.serve_process import ServeProcess, poll_until

pytestmark = pytest.mark.e2e


def test_sr_serve_without_a_config_writes_one_and_serves_the_embedded_minilm(tmp_path):
    golden = json.loads(resources.files("sr.models").joinpath("golden_minilm.json").read_text())
    text, reference = golden["inputs"][0], golden["embeddings"][0]
    router = ServeProcess(tmp_path)  # no config file: sr serve must create the default
    assert not router.config_path.exists()
    try:
        router.start(timeout_s=90)
        written = yaml.safe_load(router.config_path.read_text())
        primary = written["global"]["model_catalog"]["deployments"]["primary"]
        assert primary["artifact"] == "sentence-transformers/all-MiniLM-L6-v2"
        assert primary["replicas"] == [{"device": "cpu"}]
        answer = router.client.post("/v1/embeddings", json={"model": "primary", "input": text})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["model"] == "primary"
        vector = body["data"][0]["embedding"]
        assert len(vector) == 384
        assert math.isclose(sum(v * v for v in vector), 1.0, rel_tol=1e-5)  # normalised
        assert max(abs(a - b) for a, b in zip(vector, reference, strict=True)) <= 1e-5
        ready_line = f"sr: serving on {router.url}: 1/1 replicas of primary ready"
        # /ready can turn 200 a moment before the CLI prints its line.
        poll_until(lambda: ready_line in router.stdout_text(), 10, "the ready line")
    finally:
        assert router.stop() == []  # no worker outlives the router
