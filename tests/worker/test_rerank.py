"""/v1/rerank on the worker: answers, ordering, top_n, documents, limits and bad input, on
a tiny BERT cross-encoder (one relevance output) in process."""

from __future__ import annotations

import math

import pytest
from worker_fakes import passing_golden, post, running

from sr.models.testing import write_tiny_bert
from sr.worker.options import WorkerOptions
from sr.worker.state import WorkerState
from sr.worker.validation import MAX_INPUTS

QUERY = "where is the invoice"
DOCUMENTS = ["the invoice is attached", "bananas are yellow", "see the attached invoice", "hi"]


@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory):
    return write_tiny_bert(
        tmp_path_factory.mktemp("cross-encoder"), seed=3, with_head=True, labels=["relevance"]
    )


@pytest.fixture
async def reranker(cross_encoder_dir):
    opts = WorkerOptions(artifact=str(cross_encoder_dir))
    async with running(opts, golden_check_fn=passing_golden) as service:
        assert service.state is WorkerState.READY, service.reason
        yield service


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


async def test_results_are_sigmoid_scores_sorted_highest_first(reranker):
    status, answer = await post(reranker, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS})
    assert status == 200, answer
    assert answer["model"] == reranker.options.artifact
    results = answer["results"]
    assert sorted(r["index"] for r in results) == [0, 1, 2, 3]
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    assert all("document" not in r for r in results)
    # Each score is the sigmoid of the head's logit for that pair, scored alone.
    model = reranker.model
    for result in results:
        ((ids, second),) = model.encode_pairs(QUERY, [DOCUMENTS[result["index"]]])
        logit = model.rerank_logits([ids], [second])[0, 0].item()
        assert result["relevance_score"] == pytest.approx(_sigmoid(logit), abs=1e-7)
    pair_tokens = sum(len(ids) for ids, _ in model.encode_pairs(QUERY, DOCUMENTS))
    assert answer["usage"] == {"prompt_tokens": pair_tokens, "total_tokens": pair_tokens}


async def test_top_n_and_return_documents(reranker):
    _, full = await post(reranker, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS})
    status, answer = await post(
        reranker,
        "/v1/rerank",
        {"query": QUERY, "documents": DOCUMENTS, "top_n": 2, "return_documents": True},
    )
    assert status == 200
    assert [r["index"] for r in answer["results"]] == [r["index"] for r in full["results"][:2]]
    for result in answer["results"]:
        assert result["document"] == {"text": DOCUMENTS[result["index"]]}
    _, more = await post(
        reranker, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS, "top_n": 50}
    )
    assert len(more["results"]) == len(DOCUMENTS)  # top_n beyond the documents: all of them


async def test_the_same_document_twice_gets_the_same_score(reranker):
    status, answer = await post(
        reranker, "/v1/rerank", {"query": QUERY, "documents": ["same text", "other", "same text"]}
    )
    assert status == 200
    by_index = {r["index"]: r["relevance_score"] for r in answer["results"]}
    assert by_index[0] == by_index[2]


BAD = [
    ({"documents": ["a"]}, "query"),
    ({"query": QUERY}, "documents"),
    ({"query": "", "documents": ["a"]}, "query"),
    ({"query": 5, "documents": ["a"]}, "query"),
    ({"query": QUERY, "documents": []}, "documents"),
    ({"query": QUERY, "documents": "a"}, "documents"),
    ({"query": QUERY, "documents": ["a", 7]}, "documents[1]"),
    ({"query": QUERY, "documents": ["a", "  "]}, "documents[1]"),
    ({"query": QUERY, "documents": [{"title": "a"}]}, "documents[0].text"),
    ({"query": QUERY, "documents": [{"text": 3}]}, "documents[0].text"),
    ({"query": QUERY, "documents": ["a"], "max_chunks_per_doc": 0}, "max_chunks_per_doc"),
    ({"query": QUERY, "documents": ["a"], "max_tokens_per_doc": 0}, "max_tokens_per_doc"),
    ({"query": QUERY, "documents": ["a"], "max_tokens_per_doc": "3"}, "max_tokens_per_doc"),
    ({"query": QUERY, "documents": ["a"], "truncation_direction": "up"}, "truncation_direction"),
    ({"query": QUERY, "documents": ["a"], "top_n": 0}, "top_n"),
    ({"query": QUERY, "documents": ["a"], "top_n": "2"}, "top_n"),
    ({"query": QUERY, "documents": ["a"], "top_n": True}, "top_n"),
    ({"query": QUERY, "documents": ["a"], "top_n": 1.5}, "top_n"),
    ({"query": QUERY, "documents": ["a"], "return_documents": "yes"}, "return_documents"),
    ({"query": QUERY, "documents": ["a"], "rank_fields": ["x", "y"]}, "rank_fields"),
    ({"query": QUERY, "documents": ["a"], "rank_fields": "text"}, "rank_fields"),
    ({"query": QUERY, "documents": [{"title": "a"}, "b"], "rank_fields": ["title"]}, "rank_fields"),
    ({"query": QUERY, "documents": ["a"], "model": 3}, "model"),
]


@pytest.mark.parametrize(("body", "field"), BAD)
async def test_bad_requests_are_400_naming_the_field(reranker, body, field):
    status, answer = await post(reranker, "/v1/rerank", body)
    assert status == 400, answer
    assert answer["error"]["code"] == "invalid_request"
    assert answer["error"]["message"].startswith(field), answer["error"]["message"]


async def test_size_caps_are_413(reranker):
    status, answer = await post(
        reranker, "/v1/rerank", {"query": QUERY, "documents": ["a"] * (MAX_INPUTS + 1)}
    )
    assert status == 413 and answer["error"]["message"].startswith("documents:")
    status, answer = await post(
        reranker, "/v1/rerank", {"query": QUERY, "documents": ["ok", "x" * 200_000]}
    )
    assert status == 413 and answer["error"]["message"].startswith("documents[1]")


async def test_overflow_reject_names_the_document(cross_encoder_dir):
    opts = WorkerOptions(artifact=str(cross_encoder_dir), max_tokens=12)
    async with running(opts, golden_check_fn=passing_golden) as service:
        status, answer = await post(
            service,
            "/v1/rerank",
            {"query": QUERY, "documents": ["short", "one two three four five six seven eight"]},
        )
    assert status == 400
    assert answer["error"]["message"].startswith("documents[1]: ")
    assert "max_tokens 12" in answer["error"]["message"]


async def test_overflow_truncate_cuts_the_pair_and_says_so(cross_encoder_dir):
    opts = WorkerOptions(artifact=str(cross_encoder_dir), max_tokens=12, overflow="truncate")
    documents = ["short", "one two three four five six seven eight nine ten"]
    async with running(opts, golden_check_fn=passing_golden) as service:
        status, answer = await post(service, "/v1/rerank", {"query": QUERY, "documents": documents})
        kept = service.model.encode_pairs(QUERY, documents, truncate_to=12)
    assert status == 200
    assert answer["usage"]["truncated_inputs"] == ["documents[1]"]
    assert answer["usage"]["prompt_tokens"] == sum(len(ids) for ids, _ in kept)
    assert len(kept[1][0]) == 12


async def test_a_model_without_a_single_output_head_is_400_saying_so(tmp_path):
    plain = write_tiny_bert(tmp_path / "plain")
    three = write_tiny_bert(tmp_path / "three", with_head=True, labels=["a", "b", "c"])
    for folder, says in ((plain, "no classification head"), (three, "3 labels")):
        async with running(
            WorkerOptions(artifact=str(folder)), golden_check_fn=passing_golden
        ) as service:
            status, answer = await post(service, "/v1/rerank", {"query": QUERY, "documents": ["a"]})
        assert status == 400 and says in answer["error"]["message"], answer


async def test_cohere_and_jina_documents_and_fields(reranker):
    """Documents as `{text}` objects (Jina, Cohere v1) or picked by `rank_fields`; Cohere's
    `max_chunks_per_doc` is accepted and changes nothing, nor does a `max_tokens_per_doc`
    above every document's length."""
    _, plain = await post(reranker, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS})
    objects = [{"text": d} for d in DOCUMENTS]
    status, answer = await post(
        reranker,
        "/v1/rerank",
        {"query": QUERY, "documents": objects, "return_documents": True,
         "max_chunks_per_doc": 3, "max_tokens_per_doc": 4096},
    )  # fmt: skip
    assert status == 200, answer
    assert [r["relevance_score"] for r in answer["results"]] == [
        r["relevance_score"] for r in plain["results"]
    ]
    assert all(r["document"] == objects[r["index"]] for r in answer["results"])
    titled = [{"title": d, "id": i} for i, d in enumerate(DOCUMENTS)]
    status, answer = await post(
        reranker,
        "/v1/rerank",
        {"query": QUERY, "documents": titled, "rank_fields": ["title"], "return_documents": True},
    )
    assert status == 200, answer
    assert answer["results"][0]["relevance_score"] == plain["results"][0]["relevance_score"]
    assert answer["results"][0]["document"] == titled[answer["results"][0]["index"]]


async def test_max_tokens_per_doc_scores_each_document_cut_to_its_first_tokens(reranker):
    """Cohere's `max_tokens_per_doc`: each document's first n tokens (counted alone, without
    special tokens) are paired with the query; the answer's `document` stays the one sent."""
    model = reranker.model
    status, answer = await post(
        reranker,
        "/v1/rerank",
        {"query": QUERY, "documents": DOCUMENTS, "max_tokens_per_doc": 2,
         "return_documents": True},
    )  # fmt: skip
    assert status == 200, answer
    tokenizer = model.tokenizer
    query_ids = tokenizer.encode(QUERY).ids
    cls, sep = query_ids[0], query_ids[-1]
    rows = []
    for document in DOCUMENTS:
        first = tokenizer.encode(document, add_special_tokens=False).ids[:2]
        rows.append([*query_ids, *first, sep])
    assert all(row[0] == cls for row in rows)
    logits = model.rerank_logits(rows, [len(query_ids)] * len(rows))[:, 0].tolist()
    by_index = {r["index"]: r["relevance_score"] for r in answer["results"]}
    for index, logit in enumerate(logits):
        assert by_index[index] == pytest.approx(_sigmoid(logit), abs=1e-7)
    assert answer["usage"]["prompt_tokens"] == sum(map(len, rows))
    assert "truncated_inputs" not in answer["usage"]
    assert {r["index"]: r["document"]["text"] for r in answer["results"]} == dict(
        enumerate(DOCUMENTS)
    )
    _, whole = await post(reranker, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS})
    assert answer["results"] != whole["results"]  # the cut changed the scores
