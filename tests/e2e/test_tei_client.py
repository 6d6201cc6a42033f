"""TEI clients against a real `sr serve`: huggingface_hub's InferenceClient (the client
LangChain's and Haystack's TEI embedders call) on /embed and on the root route, and httpx
on /rerank, /tokenize and /info. Vectors are checked against the native /v1/embeddings and
transformers (MiniLM's sentence-transformers chain: mean pooling, then Normalize), tokens
against transformers' tokenizer, rerank scores against transformers'
BertForSequenceClassification on a tiny cross-encoder."""

from __future__ import annotations

import math

import huggingface_hub
import numpy as np
import pytest
import torch
import transformers

from sr.models.artifacts import EMBEDDED_DEFAULT, embedded_default_dir
from sr.models.testing import write_tiny_bert
from tests.serve_process import ServeProcess, serve_config

pytestmark = pytest.mark.e2e

TEXTS = ["hello world", "The invoice was sent by mail on Tuesday."]
QUERY = "where is my invoice"
DOCUMENTS = ["the invoice was sent by mail", "hello there", "invoices are listed under billing"]


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    """`sr serve` on the embedded default model (MiniLM: mean pooling, then Normalize)."""
    process = ServeProcess(
        tmp_path_factory.mktemp("tei-embedder"), serve_config(EMBEDDED_DEFAULT, 1)
    )
    process.start(timeout_s=60)
    yield process
    process.stop()


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    """`sr serve` on a tiny BERT cross-encoder (one relevance output)."""
    folder = write_tiny_bert(
        tmp_path_factory.mktemp("tei-models") / "cross-encoder", seed=5, with_head=True,
        labels=["score"],
    )  # fmt: skip
    process = ServeProcess(tmp_path_factory.mktemp("tei-reranker"), serve_config(folder, 1))
    process.folder = folder
    process.start(timeout_s=60)
    yield process
    process.stop()


@pytest.fixture(scope="module")
def mean_pooled():
    """MiniLM's pooled vectors before its Normalize module, computed by transformers."""
    folder = str(embedded_default_dir())
    model = transformers.AutoModel.from_pretrained(folder).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)

    def pooled(texts: list[str]) -> np.ndarray:
        batch = tokenizer(texts, padding=True, return_tensors="pt")
        with torch.no_grad():
            hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        return ((hidden * mask).sum(1) / mask.sum(1)).numpy()

    return pooled


def _native(server, texts):
    answer = server.client.post("/v1/embeddings", json={"model": "primary", "input": texts})
    assert answer.status_code == 200, answer.text
    return np.array([row["embedding"] for row in answer.json()["data"]], dtype="float32")


def test_inference_client_on_embed_matches_native_and_transformers(embedder, mean_pooled):
    client = huggingface_hub.InferenceClient(model=f"{embedder.url}/embed")
    one = client.feature_extraction(TEXTS[0])
    batch = client.feature_extraction(TEXTS)
    assert one.shape == (1, 384) and batch.shape == (2, 384)
    native = _native(embedder, TEXTS)
    assert np.array_equal(batch, native)  # the same floats as the native route
    assert np.array_equal(one[0], native[0])  # alone or batched, bit for bit
    reference = mean_pooled(TEXTS)
    reference /= np.linalg.norm(reference, axis=1, keepdims=True)
    np.testing.assert_allclose(batch, reference, atol=2e-6)
    assert np.allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)


def test_inference_client_on_the_root_route(embedder):
    client = huggingface_hub.InferenceClient(model=embedder.url)  # LangChain posts here
    vectors = client.feature_extraction(TEXTS, truncate=True)
    assert np.array_equal(vectors, _native(embedder, TEXTS))


def test_normalize_false_is_the_vector_before_normalize(embedder, mean_pooled):
    client = huggingface_hub.InferenceClient(model=f"{embedder.url}/embed")
    raw = client.feature_extraction(TEXTS, normalize=False)
    np.testing.assert_allclose(raw, mean_pooled(TEXTS), rtol=1e-5, atol=2e-6)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0, atol=1e-3)
    alone = client.feature_extraction(TEXTS[1], normalize=False)
    assert np.array_equal(alone[0], raw[1])
    cut = client.feature_extraction(TEXTS, normalize=False, dimensions=16)
    assert np.array_equal(cut, raw[:, :16])


def test_refusals_reach_the_client_with_their_field(embedder):
    client = huggingface_hub.InferenceClient(model=f"{embedder.url}/embed")
    cases = [({"prompt_name": "queyr"}, "prompt_name")]  # not one of the folder's prompts
    for options, field in cases:
        with pytest.raises(huggingface_hub.errors.HfHubHTTPError) as caught:
            client.feature_extraction("hello", **options)
        assert caught.value.response.status_code == 422
        assert caught.value.server_message.startswith(f"{field}: ")
        assert caught.value.response.json()["error_type"] == "Validation"
    empty = embedder.client.post("/embed", json={"inputs": []})
    assert empty.status_code == 400 and empty.json()["error_type"] == "Empty"


def test_tokenize_matches_transformers_and_embeds_back(embedder):
    text = "Naïve café: 3 invoices"
    answer = embedder.client.post("/tokenize", json={"inputs": [text]})
    assert answer.status_code == 200, answer.text
    (tokens,) = answer.json()
    reference = transformers.AutoTokenizer.from_pretrained(str(embedded_default_dir()))
    encoded = reference(text, return_offsets_mapping=True)
    assert [t["id"] for t in tokens] == encoded["input_ids"]
    assert [t["special"] for t in tokens] == [
        i in reference.all_special_ids for i in encoded["input_ids"]
    ]
    data = text.encode()
    for token, (start, stop) in zip(tokens, encoded["offset_mapping"], strict=True):
        if token["special"]:
            assert token["start"] is None and token["text"] in reference.all_special_tokens
            continue
        # transformers gives code-point offsets; TEI's are UTF-8 byte offsets.
        assert (token["start"], token["stop"]) == (
            len(text[:start].encode()), len(text[:stop].encode())
        )  # fmt: skip
        assert data[token["start"] : token["stop"]].decode() == token["text"]
    # TEI's ids are whole rows: embedding them gives the text's vector.
    ids = [t["id"] for t in tokens]
    by_ids = embedder.client.post("/embed", json={"inputs": ids})
    by_text = embedder.client.post("/embed", json={"inputs": text})
    assert by_ids.json() == by_text.json()


def test_info(embedder):
    answer = embedder.client.get("/info")
    assert answer.status_code == 200, answer.text
    info = answer.json()
    assert info["model_id"] == EMBEDDED_DEFAULT
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["model_dtype"] == "float32" and info["served_model_name"] == "primary"
    assert info["max_concurrent_requests"] == 32 and info["max_client_batch_size"] == 2048
    assert info["max_input_length"] == 256  # MiniLM's max_seq_length
    assert info["version"] == __import__("sr").__version__


def _reference_logits(folder, query, documents):
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(folder))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    batch = tokenizer([query] * len(documents), documents, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**batch).logits[:, 0].tolist()


def test_rerank_matches_transformers(reranker):
    logits = _reference_logits(reranker.folder, QUERY, DOCUMENTS)
    answer = reranker.client.post(
        "/rerank", json={"query": QUERY, "texts": DOCUMENTS, "return_text": True}
    )
    assert answer.status_code == 200, answer.text
    ranks = answer.json()
    expected = sorted(range(len(DOCUMENTS)), key=lambda i: -logits[i])
    assert [rank["index"] for rank in ranks] == expected
    for rank in ranks:
        assert rank["text"] == DOCUMENTS[rank["index"]]
        sigmoid = 1 / (1 + math.exp(-logits[rank["index"]]))
        assert rank["score"] == pytest.approx(sigmoid, abs=1e-6)
    raw = reranker.client.post("/", json={"query": QUERY, "texts": DOCUMENTS, "raw_scores": True})
    assert raw.status_code == 200, raw.text
    for rank in raw.json():
        assert "text" not in rank
        assert rank["score"] == pytest.approx(logits[rank["index"]], abs=1e-5)
    info = reranker.client.get("/info").json()
    assert info["model_type"] == {
        "reranker": {"id2label": {"0": "score"}, "label2id": {"score": 0}}
    }
