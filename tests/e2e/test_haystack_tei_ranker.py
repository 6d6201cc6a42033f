"""haystack's HuggingFaceTEIRanker (huggingface-api-haystack) against a real `sr serve`
serving one cross-encoder: the ranker posts to `/rerank` at the root whatever the URL's
path, so it names no deployment and is served only where one deployment is (with several it
is refused naming the ways: tests/e2e/test_framework_clients.py). Scores are checked against
the cross-encoder's logit by transformers."""

from __future__ import annotations

import pytest
from haystack import Document
from haystack_integrations.components.rankers.huggingface_api import (
    HuggingFaceTEIRanker,
    TruncationDirection,
)

from sr.models.testing import write_tiny_bert
from tests.e2e.two_deployments import cross_encoder_logits, sigmoid
from tests.serve_process import ServeProcess, serve_config

pytestmark = pytest.mark.e2e

QUERY = "where is my invoice"
DOCUMENTS = ["the invoice was sent by mail", "hello there", "invoices are listed under billing"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = write_tiny_bert(
        tmp_path_factory.mktemp("models") / "cross-encoder", seed=5, with_head=True,
        labels=["score"],
    )  # fmt: skip
    process = ServeProcess(tmp_path_factory.mktemp("one-deployment"), serve_config(folder, 1))
    process.folder = folder
    process.start(timeout_s=90)
    yield process
    process.stop()


@pytest.fixture(scope="module")
def expected_logits(server):
    return cross_encoder_logits(server.folder)([(QUERY, d) for d in DOCUMENTS])


def _best_first(logits: list[float]) -> list[int]:
    return sorted(range(len(logits)), key=lambda i: -logits[i])


def test_ranks_by_the_cross_encoders_sigmoid(server, expected_logits):
    ranker = HuggingFaceTEIRanker(url=server.url, top_k=2, token=None)
    ranked = ranker.run(query=QUERY, documents=[Document(content=d) for d in DOCUMENTS])
    best = _best_first(expected_logits)[:2]
    assert [d.content for d in ranked["documents"]] == [DOCUMENTS[i] for i in best]
    assert [d.score for d in ranked["documents"]] == pytest.approx(
        [sigmoid(expected_logits[i]) for i in best], abs=1e-6
    )


def test_raw_scores_and_truncation_direction(server, expected_logits):
    """`raw_scores` gives the logit; TruncationDirection sends TEI's capitalised "Left"."""
    ranker = HuggingFaceTEIRanker(url=server.url, raw_scores=True, token=None)
    ranked = ranker.run(
        query=QUERY, documents=[Document(content=d) for d in DOCUMENTS],
        truncation_direction=TruncationDirection.LEFT,
    )  # fmt: skip
    assert [d.score for d in ranked["documents"]] == pytest.approx(
        [expected_logits[i] for i in _best_first(expected_logits)], abs=1e-5
    )
