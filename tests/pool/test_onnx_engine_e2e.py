"""`engine: onnxruntime` through the pool, real processes: the deployment's fork server loads
the model and exports its graph without importing onnxruntime (a fork needs one thread),
both replicas are forked from it and answer as the torch engine does (within 1e-5)."""

from __future__ import annotations

import json

import pytest
import torch

from sr.config.schema import Deployment, Replica, SrConfig
from sr.events import RecordingSink
from sr.models.encoder import load_model
from sr.pool import forked, open_router
from tests.pool.test_forkserver import parent_of
from tests.pool.test_forkserver_preload import is_model_server, replicas_of
from tests.pool.test_pool_e2e import wait_until

pytestmark = pytest.mark.e2e

TEXTS = ["hello", "a longer text with a few more words in it", "x"]


async def test_replicas_fork_from_the_models_server_and_answer_as_torch(
    tiny_model_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv(forked.START_ENV, "fork")
    cfg = SrConfig()
    cfg.deployments["tiny"] = Deployment(
        artifact=str(tiny_model_dir), engine="onnxruntime", replicas=[Replica(device="cpu")] * 2
    )
    sink = RecordingSink()
    body = json.dumps({"input": TEXTS}).encode()
    async with open_router(cfg, events=sink, threads=1, run_dir=tmp_path / "run") as core:
        await core.wait_ready(60)
        await wait_until(lambda: all(r.ready for r in replicas_of(core)), 60)
        first, second = replicas_of(core)
        server = parent_of(first.pid)
        assert parent_of(second.pid) == server and is_model_server(server, tiny_model_dir)
        answered = {}
        for _ in range(4):
            reply = await core.request_raw("tiny", "/v1/embeddings", body, timeout_s=10)
            assert reply.status == 200, reply.body
            answered[reply.replica_id] = [
                row["embedding"] for row in json.loads(reply.body)["data"]
            ]
    assert set(answered) == {first.id, second.id}
    assert sink.named("model_server_unavailable") == []
    reference = load_model(tiny_model_dir)  # the torch engine, in this process
    want = reference.embed(reference.tokenize(TEXTS))
    for vectors in answered.values():
        assert (torch.tensor(vectors) - want).abs().max().item() <= 1e-5
