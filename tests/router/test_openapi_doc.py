"""The served OpenAPI document (sr.router.openapi_doc) for a config and its deployments'
cards: which deployment each body names, the limits each holds a body to, what is left out.
Bodies are checked with jsonschema, as schemathesis checks them."""

from __future__ import annotations

import json

import jsonschema

from sr.router.openapi_doc import ServedDeployment, document_json, served_deployment

EMBEDDER_CARD = {
    "head_task": None, "head_labels": None, "embedding_dim": 384, "sparse": None,
    "prompts": {"texts": {"query": "q: ", "document": ""}, "default_prompt_name": None},
}  # fmt: skip
RERANKER_CARD = {
    "head_task": "sequence", "head_labels": ["score"], "embedding_dim": 32, "sparse": None,
    "prompts": {"texts": {"query": "", "document": ""}, "default_prompt_name": None},
}  # fmt: skip
EMBEDDER = served_deployment("embedder", "org/minilm", EMBEDDER_CARD, 30522)
RERANKER = served_deployment("reranker", "/models/ce", RERANKER_CARD, 1000)


def _document(*deployments: ServedDeployment, keys: bool = False, faults: bool = False) -> dict:
    return json.loads(document_json(api_keys=keys, fault_injection=faults, deployments=deployments))


def _body_schema(document: dict, path: str) -> dict:
    schema = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    return schema["schema"]  # inlined: it points at no component


def _valid(document: dict, path: str, body: dict) -> bool:
    validator = jsonschema.Draft4Validator(_body_schema(document, path))
    return validator.is_valid(body)


def test_security_and_the_fault_route_follow_the_listener():
    plain = _document(EMBEDDER)
    assert "security" not in plain and "/api/v1/faults" not in plain["paths"]
    keyed = _document(EMBEDDER, keys=True, faults=True)
    assert keyed["security"] == [{"bearer": []}] and "/api/v1/faults" in keyed["paths"]


def test_with_several_deployments_a_body_names_one_that_serves_it():
    document = _document(EMBEDDER, RERANKER)
    assert _valid(document, "/v1/embeddings", {"model": "embedder", "input": "hi"})
    assert _valid(document, "/v1/embeddings", {"model": "org/minilm", "input": "hi"})
    assert not _valid(document, "/v1/embeddings", {"model": "elsewhere", "input": "hi"})
    # TEI's body names no deployment with one served; with two it must.
    assert not _valid(document, "/embed", {"inputs": "hi"})
    assert _valid(document, "/embed", {"inputs": "hi", "model": "reranker"})
    # Only the cross-encoder reranks.
    rerank = {"query": "q", "documents": ["d"]}
    assert _valid(document, "/v1/rerank", {**rerank, "model": "reranker"})
    assert not _valid(document, "/v1/rerank", {**rerank, "model": "embedder"})


def test_the_body_names_the_deployment_so_no_route_with_a_body_takes_model_in_the_query():
    document = _document(EMBEDDER, RERANKER)
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            names = [p.get("name") or p.get("$ref") for p in operation.get("parameters", [])]
            if method == "post" and "requestBody" in operation:
                assert "#/components/parameters/Model" not in names, path
    (info_model,) = [p for p in document["paths"]["/info"]["get"]["parameters"]]
    assert info_model["required"] is True
    assert info_model["schema"]["enum"] == ["embedder", "org/minilm", "reranker", "/models/ce"]


def test_with_one_deployment_model_may_be_left_out_or_null():
    document = _document(EMBEDDER)
    assert _valid(document, "/embed", {"inputs": "hi"})
    schema = _body_schema(document, "/embed")
    assert schema["properties"]["model"]["enum"][-1] is None
    assert document["paths"]["/info"]["get"]["parameters"][-1]["required"] is False


def test_each_deployment_s_limits_are_stated_on_its_own_variant():
    document = _document(EMBEDDER, RERANKER)
    assert _valid(document, "/v1/embeddings", {"model": "embedder", "input": [30521]})
    assert not _valid(document, "/v1/embeddings", {"model": "embedder", "input": [30522]})
    assert not _valid(document, "/v1/embeddings", {"model": "reranker", "input": [1000]})
    assert _valid(
        document, "/v1/embeddings", {"model": "embedder", "input": "a", "dimensions": 384}
    )
    assert not _valid(
        document, "/v1/embeddings", {"model": "reranker", "input": "a", "dimensions": 33}
    )
    prompted = {"model": "embedder", "input": "a", "prompt_name": "query"}
    assert _valid(document, "/v1/embeddings", prompted)
    assert not _valid(document, "/v1/embeddings", {**prompted, "prompt_name": "passage"})


def test_what_the_server_refuses_is_outside_the_document():
    document = _document(EMBEDDER, RERANKER)
    body = {"model": "embedder", "input": "hi"}
    assert not _valid(document, "/v1/embeddings", {**body, "input": "   "})  # white space only
    assert not _valid(document, "/v1/embeddings", {**body, "normalise": True})  # unknown field
    assert not _valid(document, "/v1/embeddings", {**body, "prompt_name": "query", "task": "x"})
    assert not _valid(document, "/v1/embeddings", {**body, "input": [5], "prompt_name": "query"})
    assert not _valid(document, "/v1/embeddings", {**body, "add_special_tokens": False})
    # zero-shot labels: required without a head of its own; they classify texts, not pairs
    assert not _valid(document, "/v1/classify", body)
    assert _valid(document, "/v1/classify", {**body, "labels": {"a": "about a"}})
    pairs = {"model": "reranker", "input": [["q", "d"]]}
    assert _valid(document, "/v1/classify", pairs)
    assert not _valid(document, "/v1/classify", {**pairs, "labels": {"a": "about a"}})
    assert not _valid(document, "/v1/classify", {**pairs, "aggregation_strategy": "simple"})
    rerank = {"model": "reranker", "query": "q", "documents": [{"title": "d"}]}
    assert not _valid(document, "/v1/rerank", rerank)  # a document object's text is ranked


def test_a_body_no_deployment_serves_is_left_out():
    document = _document(EMBEDDER, RERANKER)
    assert "/v1/sparse_embeddings" not in document["paths"]
    assert "/embed_sparse" not in document["paths"]
    root = _body_schema(document, "/")["oneOf"]
    # TEI's root: embed (the model without a head), rerank (the cross-encoder), similarity
    # (one variant each: their vocabularies differ), text classification (the head); no
    # token-classification task, which no deployment serves.
    served_by = sorted(tuple(variant["properties"]["model"]["enum"][:1]) for variant in root)
    assert served_by == [("embedder",), ("embedder",), ("reranker",), ("reranker",), ("reranker",)]
    assert _valid(document, "/predict", {"inputs": "hi", "model": "reranker"})
    assert not _valid(document, "/predict", {"inputs": "hi", "model": "embedder"})


def test_a_deployment_not_ready_yet_is_described_as_serving_every_body():
    waiting = served_deployment("waiting", "org/x", None, None)
    document = _document(waiting, RERANKER)
    assert "/v1/sparse_embeddings" in document["paths"]
    assert _valid(document, "/v1/rerank", {"model": "waiting", "query": "q", "documents": ["d"]})
    assert _valid(document, "/v1/embeddings", {"model": "waiting", "input": [10**6]})


def test_a_sparse_encoder_is_named_by_the_sparse_routes_only():
    splade_card = {**EMBEDDER_CARD, "sparse": {"pooling": "max", "activation": "relu"}}
    splade = served_deployment("splade", "org/splade", splade_card, 30522)
    document = _document(EMBEDDER, splade)
    sparse = _body_schema(document, "/v1/sparse_embeddings")
    assert sparse["properties"]["model"]["enum"] == ["splade", "org/splade"]
    assert not _valid(document, "/v1/embeddings", {"model": "splade", "input": "hi"})
    assert not _valid(
        document, "/v1/classify", {"model": "splade", "input": "hi", "labels": {"a": "b"}}
    )
    assert _valid(document, "/v1/tokenize", {"model": "splade", "input": "hi"})


def test_a_rerank_body_on_teis_routes_may_name_no_deployment_when_one_cross_encoder_is_sure():
    document = _document(EMBEDDER, RERANKER)
    tei_body, peer_body = {"query": "q", "texts": ["d"]}, {"query": "q", "documents": ["d"]}
    assert _valid(document, "/rerank", tei_body) and _valid(document, "/rerank", peer_body)
    assert _valid(document, "/", tei_body)
    assert not _valid(document, "/rerank", {**tei_body, "model": "embedder"})
    # The native routes always want `model`; an embedding body still names its deployment.
    assert not _valid(document, "/v1/rerank", peer_body)
    assert not _valid(document, "/embed", {"inputs": "hi"})
    # Two cross-encoders, or a card not known yet: the body must name one.
    other = served_deployment("other", "/models/ce2", RERANKER_CARD, 1000)
    for deployments in [(EMBEDDER, RERANKER, other), (ServedDeployment("cold", "x"), RERANKER)]:
        assert not _valid(_document(*deployments), "/rerank", tei_body)
