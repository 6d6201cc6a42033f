"""The framework clients, each called as its users call it, against one real `sr serve`
serving an embedder and a cross-encoder: langchain-openai's OpenAIEmbeddings,
langchain-huggingface's HuggingFaceEndpointEmbeddings (in a child), llama-index's
TEI embeddings and TEI rerank postprocessor, haystack's Hugging Face API embedders and TEI
ranker, jina-haystack's embedders and ranker, and litellm's huggingface, hosted_vllm,
infinity and cohere providers. Numbers are checked against transformers (MiniLM's mean
pooling and Normalize; the cross-encoder's logit). Versions are the test extra's pins
(docs/clients.md's table).

Everything stays on 127.0.0.1: tests/conftest.py keeps litellm and haystack off the network
at import, and every test here runs with connections and name look-ups beyond loopback
refused and recorded, so a client that phones home fails its test."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import litellm
import numpy as np
import pytest
from haystack import Document
from haystack.utils import Secret
from haystack_integrations.components.embedders.huggingface_api import (
    HuggingFaceAPIDocumentEmbedder,
    HuggingFaceAPITextEmbedder,
)
from haystack_integrations.components.embedders.jina import JinaDocumentEmbedder, JinaTextEmbedder
from haystack_integrations.components.rankers.huggingface_api import (
    HuggingFaceTEIRanker,
    TruncationDirection,
)
from haystack_integrations.components.rankers.jina import JinaRanker
from langchain_openai import OpenAIEmbeddings
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference
from llama_index.postprocessor.tei_rerank import TextEmbeddingInference

from tests.e2e.two_deployments import (
    DOCUMENTS,
    QUERY,
    TEXTS,
    cross_encoder_logits,
    minilm_vectors,
    serving_two_deployments,
    sigmoid,
)

pytestmark = [
    pytest.mark.e2e,
    # litellm's own types, built by pydantic at first use; nothing sr or the test can change.
    pytest.mark.filterwarnings("ignore:.*ReadOnly. qualifier:UserWarning"),
]

LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serving_two_deployments(tmp_path_factory)


@pytest.fixture(scope="module")
def vectors():
    return minilm_vectors()


@pytest.fixture(scope="module")
def expected_logits(server):
    """The cross-encoder's logit for (QUERY, each of DOCUMENTS)."""
    return cross_encoder_logits(server.folder)([(QUERY, d) for d in DOCUMENTS])


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    """Refuse (and record) every connection and name look-up beyond loopback; a test that
    made one fails, even when the client swallowed the error."""
    attempts: list[str] = []
    connect, getaddrinfo = socket.socket.connect, socket.getaddrinfo

    def guarded_connect(sock, address):
        if isinstance(address, tuple) and address[0] not in LOOPBACK:
            attempts.append(f"connect {address}")
            raise OSError(f"the e2e tests stay on loopback: connect {address}")
        return connect(sock, address)

    def guarded_getaddrinfo(host, *args, **kwargs):
        if host is not None and host not in LOOPBACK:
            attempts.append(f"getaddrinfo {host}")
            raise OSError(f"the e2e tests stay on loopback: look-up of {host}")
        return getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    monkeypatch.setattr(socket, "getaddrinfo", guarded_getaddrinfo)
    yield attempts
    assert attempts == []


def _best_first(logits: list[float], n: int) -> list[int]:
    return sorted(range(len(logits)), key=lambda i: -logits[i])[:n]


# langchain-openai


def test_langchain_openai_embeddings(server, vectors):
    embeddings = OpenAIEmbeddings(
        model="embedder", base_url=f"{server.url}/v1", api_key="unused",
        check_embedding_ctx_length=False,
    )  # fmt: skip
    np.testing.assert_allclose(embeddings.embed_documents(TEXTS), vectors(TEXTS), atol=2e-6)
    np.testing.assert_allclose(embeddings.embed_query(QUERY), vectors([QUERY])[0], atol=2e-6)


async def test_langchain_openai_embeddings_async(server, vectors):
    embeddings = OpenAIEmbeddings(
        model="embedder", base_url=f"{server.url}/v1", api_key="unused",
        check_embedding_ctx_length=False, dimensions=128,
    )  # fmt: skip
    reference = vectors(TEXTS)[:, :128]
    reference /= np.linalg.norm(reference, axis=1, keepdims=True)
    np.testing.assert_allclose(await embeddings.aembed_documents(TEXTS), reference, atol=2e-6)


# langchain-huggingface: every release wants huggingface_hub < 1 or < 2 while the test
# extra pins 2.4.0, so scripts/setup.sh installs 1.2.0 (the last to take a URL) with
# huggingface_hub 0.36.0 into a folder of their own, put first on a child's path.
LANGCHAIN_HUGGINGFACE = Path(sys.prefix) / "langchain-huggingface"
_LANGCHAIN_HUGGINGFACE_CALLS = """
import json, socket, sys
attempts, connect = [], socket.socket.connect
def loopback_only(sock, address):  # as the loopback_only fixture does in this process
    if isinstance(address, tuple) and address[0] not in ("127.0.0.1", "::1", "localhost"):
        attempts.append(str(address))
        raise OSError(f"the e2e tests stay on loopback: connect {address}")
    return connect(sock, address)
socket.socket.connect = loopback_only
import huggingface_hub
from langchain_huggingface import HuggingFaceEndpointEmbeddings
assert huggingface_hub.__version__ == "0.36.0", huggingface_hub.__version__
embeddings = HuggingFaceEndpointEmbeddings(model=sys.argv[1])
print(json.dumps([embeddings.embed_documents(json.loads(sys.argv[2])),
                  embeddings.embed_query(sys.argv[3]), attempts]))
"""


def test_langchain_huggingface_endpoint_embeddings(server, vectors):
    """HuggingFaceEndpointEmbeddings(model=URL) at the embedder's base URL: TEI's root route
    (feature extraction, normalised as TEI's default is)."""
    assert LANGCHAIN_HUGGINGFACE.is_dir(), "run scripts/setup.sh: it installs the folder"
    env = {**os.environ, "PYTHONPATH": str(LANGCHAIN_HUGGINGFACE)}
    run = subprocess.run(
        [sys.executable, "-c", _LANGCHAIN_HUGGINGFACE_CALLS, f"{server.url}/d/embedder/",
         json.dumps(TEXTS), QUERY],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    documents, query, attempts = json.loads(run.stdout)
    assert attempts == []
    np.testing.assert_allclose(documents, vectors(TEXTS), atol=2e-6)
    np.testing.assert_allclose(query, vectors([QUERY])[0], atol=2e-6)


# llama-index


def test_llama_index_tei_embeddings(server, vectors):
    model = TextEmbeddingsInference(model_name="embedder", base_url=f"{server.url}/d/embedder")
    np.testing.assert_allclose(model.get_text_embedding_batch(TEXTS), vectors(TEXTS), atol=2e-6)
    np.testing.assert_allclose(model.get_query_embedding(QUERY), vectors([QUERY])[0], atol=2e-6)


def test_llama_index_tei_rerank(server, expected_logits):
    rerank = TextEmbeddingInference(base_url=f"{server.url}/d/reranker", top_n=2)
    nodes = [NodeWithScore(node=TextNode(text=d), score=0.0) for d in DOCUMENTS]
    ranked = rerank.postprocess_nodes(nodes, query_bundle=QueryBundle(QUERY))
    best = _best_first(expected_logits, 2)
    assert [n.node.get_content() for n in ranked] == [DOCUMENTS[i] for i in best]
    assert [n.score for n in ranked] == pytest.approx(
        [sigmoid(expected_logits[i]) for i in best], abs=1e-6
    )


# haystack (huggingface-api-haystack)


def test_haystack_tei_text_and_document_embedders(server, vectors):
    # TEI's `normalize` is false by default here: the pooled vector before Normalize.
    text = HuggingFaceAPITextEmbedder(
        api_type="text_embeddings_inference", api_params={"url": f"{server.url}/d/embedder"},
        token=None,
    )  # fmt: skip
    embedding = text.run(text=QUERY)["embedding"]
    np.testing.assert_allclose(embedding, vectors([QUERY], normalize=False)[0], atol=2e-5)
    documents = HuggingFaceAPIDocumentEmbedder(
        api_type="text_embeddings_inference", api_params={"url": f"{server.url}/d/embedder"},
        token=None, normalize=True,
    )  # fmt: skip
    embedded = documents.run(documents=[Document(content=t) for t in TEXTS])["documents"]
    np.testing.assert_allclose([d.embedding for d in embedded], vectors(TEXTS), atol=2e-6)


def test_haystack_tei_ranker_reaches_the_only_reranker(server, expected_logits):
    """HuggingFaceTEIRanker posts to `urljoin(url, "/rerank")`, which drops the URL's path
    and query, so it names no deployment: with an embedder and one cross-encoder served, a
    rerank body that names none goes to the only deployment able to rerank."""
    ranker = HuggingFaceTEIRanker(url=f"{server.url}/d/reranker", top_k=2, token=None)
    ranked = ranker.run(query=QUERY, documents=[Document(content=d) for d in DOCUMENTS])
    best = _best_first(expected_logits, 2)
    assert [d.content for d in ranked["documents"]] == [DOCUMENTS[i] for i in best]
    assert [d.score for d in ranked["documents"]] == pytest.approx(
        [sigmoid(expected_logits[i]) for i in best], abs=1e-6
    )


def test_haystack_tei_ranker_raw_scores_and_truncation_direction(server, expected_logits):
    """`raw_scores` gives the logit; TruncationDirection sends TEI's capitalised "Left"."""
    ranker = HuggingFaceTEIRanker(url=server.url, raw_scores=True, token=None)
    ranked = ranker.run(
        query=QUERY, documents=[Document(content=d) for d in DOCUMENTS],
        truncation_direction=TruncationDirection.LEFT,
    )  # fmt: skip
    assert [d.score for d in ranked["documents"]] == pytest.approx(
        [expected_logits[i] for i in _best_first(expected_logits, len(DOCUMENTS))], abs=1e-5
    )


# jina-haystack


def test_jina_haystack_embedders(server, vectors):
    api_key = Secret.from_token("unused")
    text = JinaTextEmbedder(
        api_key=api_key, model="embedder", base_url=f"{server.url}/v1/embeddings",
        task="retrieval.query", dimensions=128,
    )  # fmt: skip
    reference = vectors([QUERY])[0][:128]
    np.testing.assert_allclose(
        text.run(text=QUERY)["embedding"], reference / np.linalg.norm(reference), atol=2e-6
    )
    documents = JinaDocumentEmbedder(
        api_key=api_key, model="embedder", base_url=f"{server.url}/v1/embeddings",
        task="retrieval.passage",
    )  # fmt: skip
    embedded = documents.run(documents=[Document(content=t) for t in TEXTS])["documents"]
    np.testing.assert_allclose([d.embedding for d in embedded], vectors(TEXTS), atol=2e-6)


def test_jina_haystack_ranker(server, expected_logits):
    ranker = JinaRanker(
        api_key=Secret.from_token("unused"), model="reranker", base_url=f"{server.url}/v1/rerank",
        top_k=2,
    )  # fmt: skip
    ranked = ranker.run(query=QUERY, documents=[Document(content=d) for d in DOCUMENTS])
    best = _best_first(expected_logits, 2)
    assert [d.content for d in ranked["documents"]] == [DOCUMENTS[i] for i in best]
    assert [d.score for d in ranked["documents"]] == pytest.approx(
        [sigmoid(expected_logits[i]) for i in best], abs=1e-6
    )


# litellm


def _only_the_config_lookup(attempts: list[str]) -> None:
    """litellm's huggingface provider prices each answer from the model's config.json,
    which it fetches from huggingface.co whatever the api_base (refused here, which litellm
    logs and passes over); nothing else may leave loopback."""
    assert attempts and set(attempts) == {"getaddrinfo huggingface.co"}
    attempts.clear()


def test_litellm_huggingface_embedding(server, vectors, loopback_only):
    # `input_type` names the task; without it litellm asks huggingface.co for the model's.
    answer = litellm.embedding(
        model="huggingface/embedder", api_base=f"{server.url}/d/embedder", input=TEXTS,
        input_type="feature-extraction",
    )  # fmt: skip
    np.testing.assert_allclose([row["embedding"] for row in answer.data], vectors(TEXTS), atol=2e-6)
    _only_the_config_lookup(loopback_only)


def test_litellm_hosted_vllm_embedding(server, vectors):
    answer = litellm.embedding(
        model="hosted_vllm/embedder", api_base=f"{server.url}/v1", input=TEXTS, api_key="unused"
    )
    np.testing.assert_allclose([row["embedding"] for row in answer.data], vectors(TEXTS), atol=2e-6)


@pytest.mark.parametrize(
    ("model", "api_base"),
    [
        ("huggingface/reranker", "/d/reranker"),  # TEI's body on /rerank, plus top_n
        ("cohere/reranker", ""),  # Cohere's v2 body on /v2/rerank
        ("hosted_vllm/reranker", ""),  # vLLM's (Cohere/Jina) body on /rerank
        # Infinity's body on /rerank; Infinity answers `document` as a bare string, which
        # litellm's infinity provider reads, where sr answers Cohere's and Jina's {text}.
        ("infinity/reranker", ""),
    ],
)
def test_litellm_rerank(server, expected_logits, model, api_base, loopback_only):
    answer = litellm.rerank(
        model=model, api_base=f"{server.url}{api_base}", api_key="unused", query=QUERY,
        documents=DOCUMENTS, top_n=2, return_documents=not model.startswith("infinity/"),
    )  # fmt: skip
    best = _best_first(expected_logits, 2)
    assert [r["index"] for r in answer.results] == best
    assert [r["relevance_score"] for r in answer.results] == pytest.approx(
        [sigmoid(expected_logits[i]) for i in best], abs=1e-6
    )
    if not model.startswith("infinity/"):
        assert [r["document"]["text"] for r in answer.results] == [DOCUMENTS[i] for i in best]
    if model.startswith("huggingface/"):
        _only_the_config_lookup(loopback_only)


def test_the_loopback_guard_refuses_and_records(loopback_only):
    """The guard every test here runs under can fail one: what it refused is recorded."""
    with pytest.raises(httpx.ConnectError, match="stay on loopback"):
        httpx.get("http://example.com/", timeout=1)
    assert loopback_only == ["getaddrinfo example.com"]
    loopback_only.clear()
