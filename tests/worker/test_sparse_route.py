"""POST /v1/sparse_embeddings on the worker, in process: a SPLADE folder's vectors as their
non-zero entries, equal to SparseEncoder.encode (prompts included), through the real warm-up
(golden reruns, batch-invariance probe) and the batching engine."""

from __future__ import annotations

import pytest
import torch
from worker_fakes import passing_golden, post, running

from sr.worker.options import WorkerOptions
from sr.worker.state import WorkerState
from tests.models.st_reference import encode, save_sparse_encoder
from tests.models.test_sparse_encoder import write_mlm

TOLERANCE = 1e-5
TEXTS = ["hello world", "what does a sparse encoder answer?", "b"]
PROMPTS = {"query": "query: "}


@pytest.fixture(scope="module")
def splade_dir(tmp_path_factory):
    mlm = write_mlm(tmp_path_factory.mktemp("mlm"), "bert", seed=3)
    out = tmp_path_factory.mktemp("splade") / "model"
    return save_sparse_encoder(mlm, out, pooling="max", activation="relu", prompts=PROMPTS)


def _dense(answer: dict, vocab: int) -> torch.Tensor:
    rows = sorted(answer["data"], key=lambda row: row["index"])
    out = torch.zeros(len(rows), vocab)
    for i, row in enumerate(rows):
        assert row["object"] == "sparse_embedding"
        assert row["indices"] == sorted(row["indices"])
        assert all(value > 0 for value in row["values"])
        out[i, row["indices"]] = torch.tensor(row["values"])
    return out


async def test_sparse_embeddings_match_sparse_encoder(splade_dir, tmp_path):
    want = encode(splade_dir, [{"texts": TEXTS}, {"texts": TEXTS, "prompt_name": "query"}],
                  sparse=True, work=tmp_path)  # fmt: skip
    async with running(WorkerOptions(artifact=str(splade_dir))) as service:
        assert service.state is WorkerState.READY, service.reason
        assert service.golden["status"] == "passed"
        assert service.probe.passed  # rows bit-identical alone and batched
        vocab = service.model.embedding_dim
        card = service.card()
        assert card["sparse"] == {"pooling": "max", "activation": "relu", "max_active_dims": None}
        for body, reference in (({}, want[0]), ({"prompt_name": "query"}, want[1])):
            status, answer = await post(
                service, "/v1/sparse_embeddings", {"input": TEXTS, "model": str(splade_dir), **body}
            )
            assert status == 200, answer
            assert answer["model"] == str(splade_dir) and answer["object"] == "list"
            got = _dense(answer, vocab)
            assert float((got - reference).abs().max()) <= TOLERANCE
            rows = service.model.tokenize([PROMPTS.get(body.get("prompt_name"), "") + t
                                           for t in TEXTS])  # fmt: skip
            assert answer["usage"]["prompt_tokens"] == sum(map(len, rows))
            for index, text in enumerate(TEXTS):  # alone == in the batch, bit for bit
                body_alone = {"input": text, **body}
                _, alone = await post(service, "/v1/sparse_embeddings", body_alone)
                assert alone["data"][0]["indices"] == answer["data"][index]["indices"]
                assert alone["data"][0]["values"] == answer["data"][index]["values"]


async def test_sparse_and_dense_routes_refuse_the_other_kind(splade_dir, tiny_model_dir):
    async with running(WorkerOptions(artifact=str(splade_dir)),
                       golden_check_fn=passing_golden) as service:  # fmt: skip
        status, answer = await post(service, "/v1/embeddings", {"input": "hi"})
        assert status == 400
        assert "/v1/sparse_embeddings" in answer["error"]["message"]
        status, answer = await post(
            service, "/v1/sparse_embeddings", {"input": "hi", "prompt_name": "passage"}
        )
        assert status == 400
        assert answer["error"]["message"].startswith("prompt_name: unknown prompt 'passage'")
        status, answer = await post(service, "/v1/sparse_embeddings", {"input": "hi", "dim": 3})
        assert status == 400 and answer["error"]["message"].startswith("dim: unknown field")
    async with running(WorkerOptions(artifact=str(tiny_model_dir)),
                       golden_check_fn=passing_golden) as service:  # fmt: skip
        status, answer = await post(service, "/v1/sparse_embeddings", {"input": "hi"})
        assert status == 400
        assert "not a sparse encoder" in answer["error"]["message"]
        assert service.card()["sparse"] is None
