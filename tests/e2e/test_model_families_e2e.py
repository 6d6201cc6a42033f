"""`sr serve` as a real process with two deployments of other kinds than the embedder: a
tiny BERT cross-encoder answering /v1/rerank and a tiny ModernBERT classifier answering
/v1/classify with its own labels, both through the router."""

from __future__ import annotations

import math

import pytest
import torch
import transformers

from sr.models import load_model
from sr.models.testing import write_tiny_bert
from tests.models.reference import VOCAB, write_reference
from tests.serve_process import ServeProcess

pytestmark = pytest.mark.e2e

LABELS = {0: "billing", 1: "greeting", 2: "complaint"}
QUERY = "where is my invoice"
DOCUMENTS = ["the invoice was sent by mail", "hello there", "invoices are listed under billing"]


def _deployment(folder) -> dict:
    return {"artifact": str(folder), "replicas": [{"device": "cpu"}]}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    models = tmp_path_factory.mktemp("families-e2e-models")
    reranker = write_tiny_bert(models / "cross-encoder", seed=5, with_head=True, labels=["score"])
    config = transformers.ModernBertConfig(
        vocab_size=VOCAB, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=256, local_attention=8,
        global_attn_every_n_layers=2, pad_token_id=0, num_labels=3, id2label=LABELS,
    )  # fmt: skip
    classifier = write_reference(models / "modernbert-classifier", config, head=True)
    workdir = tmp_path_factory.mktemp("families-e2e")
    process = ServeProcess(
        workdir,
        {
            "global": {
                "model_catalog": {
                    "deployments": {
                        "reranker": _deployment(reranker),
                        "classifier": _deployment(classifier),
                    },
                    "system": {"decision_model": {"deployment": "reranker"}},
                }
            },
            "listeners": [{"host": "127.0.0.1", "port": 8899}],
        },
    )
    process.start(timeout_s=60)
    yield process, reranker, classifier
    process.stop()


def test_a_cross_encoder_deployment_reranks_through_the_router(served):
    process, reranker, _ = served
    answer = process.client.post(
        "/v1/rerank",
        json={"model": "reranker", "query": QUERY, "documents": DOCUMENTS, "top_n": 2,
              "return_documents": True},
    )  # fmt: skip
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["model"] == "reranker"
    # The same scores sr's model gives in process (the worker runs the same arithmetic).
    model = load_model(reranker)
    pairs = model.encode_pairs(QUERY, DOCUMENTS)
    logits = model.rerank_logits([ids for ids, _ in pairs], [s for _, s in pairs])[:, 0]
    want = sorted(
        ((1 / (1 + math.exp(-x)), i) for i, x in enumerate(logits.tolist())),
        key=lambda pair: (-pair[0], pair[1]),
    )[:2]
    assert [r["index"] for r in body["results"]] == [i for _, i in want]
    for result, (score, index) in zip(body["results"], want, strict=True):
        assert result["relevance_score"] == pytest.approx(score, abs=1e-6)
        assert result["document"] == {"text": DOCUMENTS[index]}
    assert body["usage"]["prompt_tokens"] == sum(len(ids) for ids, _ in pairs)


def test_a_modernbert_classifier_deployment_answers_with_its_own_labels(served):
    process, _, classifier = served
    texts = ["please send the invoice again", "hi!"]
    answer = process.client.post("/v1/classify", json={"model": "classifier", "input": texts})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["model"] == "classifier"
    model = load_model(classifier)
    want = torch.softmax(model.classify_logits(model.tokenize(texts)), dim=1).tolist()
    for result, row in zip(body["results"], want, strict=True):
        assert list(result["probabilities"]) == list(LABELS.values())
        assert list(result["probabilities"].values()) == pytest.approx(row, abs=1e-6)
        assert result["label"] == LABELS[max(range(3), key=row.__getitem__)]


def test_rerank_on_a_deployment_without_a_relevance_head_is_400_saying_so(served):
    process, _, _ = served
    answer = process.client.post(
        "/v1/rerank", json={"model": "classifier", "query": QUERY, "documents": DOCUMENTS}
    )
    assert answer.status_code == 400
    assert "3 labels" in answer.json()["error"]["message"]
    empty = process.client.post(
        "/v1/rerank", json={"model": "reranker", "query": QUERY, "documents": []}
    )
    assert empty.status_code == 400
    assert empty.json()["error"]["message"].startswith("documents")
