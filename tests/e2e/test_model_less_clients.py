"""Clients that never send `model` (or send their own) against one real `sr serve` serving
two deployments, an embedder and a cross-encoder, each reached at its base URL
(`/d/<deployment>/`) or with `?model=`: huggingface_hub's InferenceClient (feature
extraction, sentence similarity, text classification), cohere's ClientV2 (rerank on
/v2/rerank), and httpx for the bodies other clients post (TEI's /predict with pairs, a
Cohere/Jina body on /rerank, Infinity's /embeddings). Numbers are checked against
transformers (MiniLM's mean pooling and Normalize; the cross-encoder's logit)."""

from __future__ import annotations

import cohere
import httpx
import huggingface_hub
import numpy as np
import openai
import pytest
import torch
import transformers

from sr.models.artifacts import embedded_default_dir
from tests.e2e.two_deployments import (
    DOCUMENTS,
    QUERY,
    TEXTS,
    cross_encoder_logits,
    minilm_vectors,
    serving_two_deployments,
    sigmoid,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serving_two_deployments(tmp_path_factory)


@pytest.fixture(scope="module")
def unit_vectors():
    return minilm_vectors()


@pytest.fixture(scope="module")
def logits(server):
    return cross_encoder_logits(server.folder)


def test_inference_client_at_each_base_url(server, unit_vectors):
    embedder = huggingface_hub.InferenceClient(model=f"{server.url}/d/embedder/")
    vectors = embedder.feature_extraction(TEXTS)
    np.testing.assert_allclose(vectors, unit_vectors(TEXTS), atol=2e-6)
    on_embed = huggingface_hub.InferenceClient(model=f"{server.url}/d/embedder/embed")
    assert np.array_equal(on_embed.feature_extraction(TEXTS), vectors)
    queried = huggingface_hub.InferenceClient(model=f"{server.url}/embed?model=embedder")
    assert np.array_equal(queried.feature_extraction(TEXTS), vectors)
    # Without an address, two deployments cannot be told apart: refused naming the ways.
    with pytest.raises(huggingface_hub.errors.HfHubHTTPError) as caught:
        huggingface_hub.InferenceClient(model=f"{server.url}/embed").feature_extraction("hi")
    assert caught.value.response.status_code == 422
    assert "/d/<deployment>/" in caught.value.server_message


def test_inference_client_sentence_similarity(server, unit_vectors):
    client = huggingface_hub.InferenceClient(model=f"{server.url}/d/embedder/")
    similarities = client.sentence_similarity(TEXTS[0], other_sentences=[TEXTS[1], "hello"])
    reference = unit_vectors([TEXTS[0], TEXTS[1], "hello"])
    expected = [float(reference[0] @ reference[1]), float(reference[0] @ reference[2])]
    assert similarities == pytest.approx(expected, abs=2e-6)
    route = httpx.post(
        f"{server.url}/similarity?model=embedder",
        json={"inputs": {"source_sentence": TEXTS[0], "sentences": [TEXTS[1], "hello"]}},
    )
    assert route.status_code == 200 and route.json() == similarities


def test_inference_client_text_classification(server, logits):
    client = huggingface_hub.InferenceClient(model=f"{server.url}/d/reranker/")
    (result,) = client.text_classification(QUERY)
    assert result.label == "score"
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(server.folder))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(server.folder))
    with torch.no_grad():
        logit = model(**tokenizer([QUERY], return_tensors="pt")).logits[0, 0].item()
    assert result.score == pytest.approx(sigmoid(logit), abs=1e-6)
    (raw,) = client.text_classification(QUERY, function_to_apply="none")
    assert raw.score == pytest.approx(logit, abs=1e-5)


def test_cohere_client_v2_rerank(server, logits):
    client = cohere.ClientV2(api_key="unused", base_url=server.url)
    answer = client.rerank(model="reranker", query=QUERY, documents=DOCUMENTS, top_n=2)
    expected = logits([(QUERY, d) for d in DOCUMENTS])
    best = sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i])[:2]
    assert [r.index for r in answer.results] == best
    for result in answer.results:
        assert result.relevance_score == pytest.approx(sigmoid(expected[result.index]), abs=1e-6)
    at_base = cohere.ClientV2(api_key="unused", base_url=f"{server.url}/d/reranker")
    again = at_base.rerank(model="reranker", query=QUERY, documents=DOCUMENTS, top_n=2)
    assert [r.relevance_score for r in again.results] == [r.relevance_score for r in answer.results]


def test_cohere_max_tokens_per_doc_scores_each_documents_first_tokens(server):
    """Cohere's `max_tokens_per_doc` on /v2/rerank (the client's call) and /v1/rerank: the
    reference pairs the query with each document's first n tokens, cut in the test."""
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(server.folder))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(server.folder))
    query_ids = tokenizer(QUERY)["input_ids"]
    expected = []
    for document in DOCUMENTS:
        first = tokenizer(document, add_special_tokens=False)["input_ids"][:3]
        ids = [*query_ids, *first, tokenizer.sep_token_id]
        types = [0] * len(query_ids) + [1] * (len(first) + 1)
        with torch.no_grad():
            logit = model(
                input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types])
            ).logits[0, 0]
        expected.append(sigmoid(logit.item()))
    client = cohere.ClientV2(api_key="unused", base_url=server.url)
    answer = client.rerank(model="reranker", query=QUERY, documents=DOCUMENTS, max_tokens_per_doc=3)
    by_index = {r.index: r.relevance_score for r in answer.results}
    assert [by_index[i] for i in range(len(DOCUMENTS))] == pytest.approx(expected, abs=1e-6)
    whole = client.rerank(model="reranker", query=QUERY, documents=DOCUMENTS)
    assert {r.index: r.relevance_score for r in whole.results} != by_index
    v1 = httpx.post(
        f"{server.url}/v1/rerank",
        json={"model": "reranker", "query": QUERY, "documents": DOCUMENTS,
              "max_tokens_per_doc": 3},
    )  # fmt: skip
    assert v1.status_code == 200, v1.text
    assert {r["index"]: r["relevance_score"] for r in v1.json()["results"]} == by_index


def test_peer_rerank_bodies_on_rerank(server, logits):
    """The body vLLM's, Infinity's and litellm's huggingface providers post to /rerank."""
    expected = logits([(QUERY, d) for d in DOCUMENTS])
    jina = httpx.post(
        f"{server.url}/d/reranker/rerank",
        json={"query": QUERY, "documents": [{"text": d} for d in DOCUMENTS], "top_n": 1,
              "return_documents": True},
    )  # fmt: skip
    assert jina.status_code == 200, jina.text
    (top,) = jina.json()["results"]
    assert top["index"] == max(range(len(DOCUMENTS)), key=expected.__getitem__)
    assert top["document"] == {"text": DOCUMENTS[top["index"]]}
    tei_top_n = httpx.post(
        f"{server.url}/rerank?model=reranker", json={"query": QUERY, "texts": DOCUMENTS, "top_n": 1}
    )
    assert tei_top_n.status_code == 200, tei_top_n.text
    assert [rank["index"] for rank in tei_top_n.json()] == [top["index"]]


def test_predict_texts_and_pairs(server, logits):
    pairs = [[QUERY, d] for d in DOCUMENTS]
    answer = httpx.post(f"{server.url}/d/reranker/predict", json={"inputs": pairs})
    assert answer.status_code == 200, answer.text
    expected = logits([tuple(pair) for pair in pairs])
    for predictions, logit in zip(answer.json(), expected, strict=True):
        assert predictions == [{"score": pytest.approx(sigmoid(logit), abs=1e-6), "label": "score"}]
    one = httpx.post(
        f"{server.url}/d/reranker/predict", json={"inputs": pairs[0], "raw_scores": True}
    )
    assert one.status_code == 200, one.text
    assert one.json() == [{"score": pytest.approx(expected[0], abs=1e-5), "label": "score"}]


def test_openai_sdk_at_a_base_url_and_infinitys_path(server, unit_vectors):
    client = openai.OpenAI(api_key="unused", base_url=f"{server.url}/d/embedder")  # /embeddings
    answer = client.embeddings.create(model="embedder", input=TEXTS)
    vectors = np.array([row.embedding for row in answer.data])
    np.testing.assert_allclose(vectors, unit_vectors(TEXTS), atol=2e-6)


def test_too_long_with_truncate_false_is_413_and_left_truncation_keeps_the_end(server):
    long = "invoice " * 400
    refused = httpx.post(f"{server.url}/d/embedder/embed", json={"inputs": long, "truncate": False})
    assert refused.status_code == 413 and refused.json()["error_type"] == "Validation"
    left = httpx.post(
        f"{server.url}/d/embedder/embed",
        json={"inputs": "start " + long + "end", "truncate": True, "truncation_direction": "left"},
    )
    right = httpx.post(
        f"{server.url}/d/embedder/embed",
        json={"inputs": "start " + long + "end", "truncate": True},
    )
    assert left.status_code == right.status_code == 200
    assert left.json() != right.json()


def test_models_list_each_base_path(server):
    models = httpx.get(f"{server.url}/v1/models").json()["data"]
    assert {m["id"]: m["base_path"] for m in models} == {
        "embedder": "/d/embedder/",
        "reranker": "/d/reranker/",
    }


def test_embed_all_is_the_last_hidden_state_per_token(server):
    folder = str(embedded_default_dir())
    model = transformers.AutoModel.from_pretrained(folder).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    answer = httpx.post(f"{server.url}/d/embedder/embed_all", json={"inputs": TEXTS})
    assert answer.status_code == 200, answer.text
    for text, tokens in zip(TEXTS, answer.json(), strict=True):
        with torch.no_grad():
            hidden = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0]
        np.testing.assert_allclose(np.array(tokens), hidden.numpy(), atol=1e-4)


def test_decode_is_the_tokenizers_decode(server):
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(embedded_default_dir()))
    ids = [tokenizer(text)["input_ids"] for text in TEXTS]
    answer = httpx.post(f"{server.url}/d/embedder/decode", json={"ids": ids})
    assert answer.status_code == 200, answer.text
    assert answer.json() == [tokenizer.decode(row, skip_special_tokens=True) for row in ids]
    one = httpx.post(
        f"{server.url}/decode?model=embedder", json={"ids": ids[0], "skip_special_tokens": False}
    )
    assert one.json() == [tokenizer.decode(ids[0], skip_special_tokens=False)]
    bad = httpx.post(f"{server.url}/d/embedder/decode", json={"ids": [10**9]})
    assert bad.status_code == 422 and bad.json()["error"].startswith("ids[0]: token id")
