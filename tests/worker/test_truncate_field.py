"""A request's `truncate` overrides the deployment's `input.overflow`, on every task."""

from __future__ import annotations

import pytest
from worker_fakes import passing_golden, post, running

from sr.models.testing import write_tiny_bert
from sr.worker.options import WorkerOptions

LONG = "one two three four five six seven eight nine ten"
QUESTION = {"type": "choice", "criteria": {"a": "one", "b": LONG}}
BODIES = {
    "/v1/embeddings": {"input": ["short", LONG]},
    "/v1/classify": {"input": ["short", LONG], "labels": {"x": "a label"}},
    "/v1/decisions": {"state": LONG, "questions": {"q": QUESTION}},
    "/v1/rerank": {"query": "short", "documents": ["short", LONG]},
}


@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory):
    # One relevance output: serves every route (zero-shot classify and decisions embed).
    return write_tiny_bert(tmp_path_factory.mktemp("x"), with_head=True, labels=["score"])


@pytest.mark.parametrize("path", list(BODIES))
async def test_truncate_true_cuts_where_the_deployment_rejects(cross_encoder_dir, path):
    opts = WorkerOptions(artifact=str(cross_encoder_dir), max_tokens=8)
    async with running(opts, golden_check_fn=passing_golden) as service:
        refused, refusal = await post(service, path, BODIES[path])
        status, answer = await post(service, path, {**BODIES[path], "truncate": True})
    assert refused == 400 and "truncate: true" in refusal["error"]["message"]
    assert status == 200, answer
    assert answer["usage"]["truncated_inputs"]


@pytest.mark.parametrize("path", list(BODIES))
async def test_truncate_false_rejects_where_the_deployment_cuts(cross_encoder_dir, path):
    opts = WorkerOptions(artifact=str(cross_encoder_dir), max_tokens=8, overflow="truncate")
    async with running(opts, golden_check_fn=passing_golden) as service:
        cut, _ = await post(service, path, BODIES[path])
        status, answer = await post(service, path, {**BODIES[path], "truncate": False})
    assert cut == 200
    assert status == 400 and "max_tokens 8" in answer["error"]["message"]


async def test_truncate_must_be_a_boolean(worker):
    status, answer = await post(worker, "/v1/embeddings", {"input": "x", "truncate": "yes"})
    assert status == 400
    assert answer["error"]["param"] == "truncate"


async def test_truncation_direction_left_keeps_the_end(cross_encoder_dir):
    """`truncation_direction: left` (TEI's) keeps a text's end and its special tokens: the
    vector of the cut row equals the vector of those ids sent whole; a pair is cut by the
    tokenizer's own left truncation (longest text first); a text pair classified likewise."""
    opts = WorkerOptions(artifact=str(cross_encoder_dir), max_tokens=8, overflow="truncate")
    async with running(opts, golden_check_fn=passing_golden) as service:
        model = service.model
        (ids,) = model.tokenize([LONG])
        kept = ids[:1] + ids[-7:]  # [CLS], the last six words' tokens, [SEP]
        assert kept == model.truncate_left(ids, 8)
        left = {"input": LONG, "truncation_direction": "left"}
        status, answer = await post(service, "/v1/embeddings", left)
        assert status == 200, answer
        _, whole = await post(
            service, "/v1/embeddings", {"input": kept, "add_special_tokens": False}
        )
        assert answer["data"][0]["embedding"] == pytest.approx(
            whole["data"][0]["embedding"], abs=1e-6
        )
        _, right = await post(service, "/v1/embeddings", {"input": LONG})
        assert right["data"][0]["embedding"] != answer["data"][0]["embedding"]
        body = {"query": "short", "documents": [LONG], "raw_scores": True}
        status, ranked = await post(service, "/v1/rerank", {**body, "truncation_direction": "left"})
        assert status == 200, ranked
        ((pair, second),) = model.encode_pairs("short", [LONG], 8, "left")
        assert ranked["results"][0]["relevance_score"] == pytest.approx(
            model.rerank_logits([pair], [second])[0, 0].item(), abs=1e-6
        )
        status, classified = await post(
            service,
            "/v1/classify",
            {"input": [["short", LONG]], "raw_scores": True, "truncation_direction": "left"},
        )
        assert status == 200, classified
        assert classified["results"][0]["probabilities"]["score"] == pytest.approx(
            ranked["results"][0]["relevance_score"], abs=1e-6
        )
