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
