"""The native worker fields TEI's routes need, in process on tiny BERTs: /v1/embeddings
`normalize` and `add_special_tokens`, /v1/rerank `raw_scores`, and /v1/tokenize."""

from __future__ import annotations

import json
import math
import shutil

import pytest
from worker_fakes import passing_golden, post, running

from sr.models.testing import write_tiny_bert
from sr.worker.options import WorkerOptions
from tests.float32 import as_float32

TEXTS = ["hello world", "a somewhat longer sentence about invoices and bills", "hi"]
HELLO_WORLD = [101, 7592, 2088, 102]  # [CLS] hello world [SEP] (MiniLM vocabulary)


def _norm(vector):
    return math.sqrt(math.fsum(x * x for x in vector))


@pytest.fixture(scope="module")
def raw_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny BERT without its Normalize module."""
    folder = tmp_path_factory.mktemp("tiny-bert-no-normalize") / "model"
    shutil.copytree(tiny_model_dir, folder)
    modules = json.loads((folder / "modules.json").read_text())
    (folder / "modules.json").write_text(
        json.dumps([m for m in modules if not m["type"].endswith("Normalize")])
    )
    return folder


@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory):
    return write_tiny_bert(
        tmp_path_factory.mktemp("tei-cross-encoder"), seed=4, with_head=True, labels=["score"]
    )


async def _vectors(service, **body) -> list[list[float]]:
    status, answer = await post(service, "/v1/embeddings", body)
    assert status == 200, answer
    return [row["embedding"] for row in answer["data"]]


# -- normalize -----------------------------------------------------------------------------
async def test_normalize_false_is_the_vector_before_normalize(worker, raw_model_dir):
    assert worker.model.normalize is True
    default = await _vectors(worker, input=TEXTS)
    raw = await _vectors(worker, input=TEXTS, normalize=False)
    assert await _vectors(worker, input=TEXTS, normalize=True) == default
    for unit, vector in zip(default, raw, strict=True):
        assert not math.isclose(_norm(vector), 1.0, rel_tol=1e-3)
        assert [x / _norm(vector) for x in vector] == pytest.approx(unit, rel=1e-5, abs=1e-7)
    # The same checkpoint without its Normalize module computes exactly these vectors.
    opts = WorkerOptions(artifact=str(raw_model_dir))
    async with running(opts, golden_check_fn=passing_golden) as service:
        assert service.model.normalize is False
        assert await _vectors(service, input=TEXTS) == raw


async def test_unnormalized_rows_are_bit_identical_alone_and_batched(worker):
    batched = await _vectors(worker, input=TEXTS, normalize=False)
    alone = [(await _vectors(worker, input=text, normalize=False))[0] for text in TEXTS]
    assert alone == batched
    reversed_batch = await _vectors(worker, input=TEXTS[::-1], normalize=False)
    assert reversed_batch[::-1] == batched


async def test_normalize_true_on_a_model_without_normalize(raw_model_dir):
    opts = WorkerOptions(artifact=str(raw_model_dir))
    async with running(opts, golden_check_fn=passing_golden) as service:
        # The model's float32 values, from which the worker normalises.
        raw = [as_float32(vector) for vector in await _vectors(service, input=TEXTS)]
        unit = await _vectors(service, input=TEXTS, normalize=True)
        cut = await _vectors(service, input=TEXTS, normalize=True, dimensions=8)
        cut_raw = await _vectors(service, input=TEXTS, normalize=False, dimensions=8)
    for vector, normalized in zip(raw, unit, strict=True):
        assert math.isclose(_norm(normalized), 1.0, rel_tol=1e-9)
        assert normalized == pytest.approx([x / _norm(vector) for x in vector], rel=1e-12)
    for vector, head in zip(raw, cut, strict=True):  # cut first, then normalised (TEI's order)
        assert head == pytest.approx([x / _norm(vector[:8]) for x in vector[:8]], rel=1e-12)
    assert [as_float32(vector) for vector in cut_raw] == [vector[:8] for vector in raw]


async def test_normalize_false_with_dimensions_only_cuts(worker):
    raw = await _vectors(worker, input=TEXTS, normalize=False)
    assert await _vectors(worker, input=TEXTS, normalize=False, dimensions=5) == [
        vector[:5] for vector in raw
    ]


@pytest.mark.parametrize("value", [None, 0, "false", [True]])
async def test_bad_normalize_is_400_naming_it(worker, value):
    status, answer = await post(worker, "/v1/embeddings", {"input": "x", "normalize": value})
    assert status == 400, answer
    assert answer["error"]["param"] == "normalize"


# -- add_special_tokens --------------------------------------------------------------------
async def test_whole_rows_of_token_ids_embed_as_given(worker):
    text = await _vectors(worker, input=["hello world", "hello"])
    rows = await _vectors(worker, input=[HELLO_WORLD, [101, 7592, 102]], add_special_tokens=False)
    assert rows == text
    one = await _vectors(worker, input=HELLO_WORLD, add_special_tokens=False)
    assert one == text[:1]
    framed = await _vectors(worker, input=HELLO_WORLD, add_special_tokens=True)
    assert framed != text[:1]  # [CLS] [CLS] hello world [SEP] [SEP]


async def test_whole_rows_are_cut_as_they_stand(tiny_model_dir):
    ids = [101, *([7592] * 10), 102]
    opts = WorkerOptions(artifact=str(tiny_model_dir), max_tokens=8, overflow="truncate")
    async with running(opts, golden_check_fn=passing_golden) as service:
        status, answer = await post(
            service, "/v1/embeddings", {"input": ids, "add_special_tokens": False}
        )
        assert status == 200, answer
        assert answer["usage"]["truncated_inputs"] == ["input"]
        assert answer["usage"]["prompt_tokens"] == 8
        head = await _vectors(service, input=ids[:8], add_special_tokens=False)
        assert answer["data"][0]["embedding"] == head[0]
        status, answer = await post(
            service,
            "/v1/embeddings",
            {"input": ids, "add_special_tokens": False, "truncate": False},
        )
    assert status == 400 and answer["error"]["param"] == "input"


async def test_add_special_tokens_false_on_text_is_refused(worker):
    status, answer = await post(
        worker, "/v1/embeddings", {"input": "hello", "add_special_tokens": False}
    )
    assert status == 400, answer
    assert answer["error"]["param"] == "add_special_tokens"
    assert "token-id input only" in answer["error"]["message"]


# -- raw_scores ----------------------------------------------------------------------------
async def test_raw_scores_are_the_head_logits(cross_encoder_dir):
    query, documents = "where is the invoice", ["the invoice is attached", "bananas", "hi"]
    opts = WorkerOptions(artifact=str(cross_encoder_dir))
    async with running(opts, golden_check_fn=passing_golden) as service:
        body = {"query": query, "documents": documents}
        status, scored = await post(service, "/v1/rerank", body)
        assert status == 200, scored
        status, raw = await post(service, "/v1/rerank", {**body, "raw_scores": True})
        assert status == 200, raw
        pairs = service.model.encode_pairs(query, documents)
        logits = service.model.rerank_logits([i for i, _ in pairs], [s for _, s in pairs])
        status, bad = await post(service, "/v1/rerank", {**body, "raw_scores": 1})
    assert [r["index"] for r in raw["results"]] == [r["index"] for r in scored["results"]]
    for result, sigmoid in zip(raw["results"], scored["results"], strict=True):
        assert result["relevance_score"] == pytest.approx(logits[result["index"], 0].item())
        expected = 1 / (1 + math.exp(-result["relevance_score"]))
        assert sigmoid["relevance_score"] == pytest.approx(expected, rel=1e-12)
    assert status == 400 and bad["error"]["param"] == "raw_scores"


# -- /v1/tokenize --------------------------------------------------------------------------
async def test_tokenize_gives_ids_texts_and_code_point_offsets(worker):
    status, answer = await post(worker, "/v1/tokenize", {"input": ["hello world", "café über"]})
    assert status == 200, answer
    assert answer["object"] == "list" and answer["model"] == worker.options.artifact
    first, second = (row["tokens"] for row in answer["data"])
    assert [t["id"] for t in first] == HELLO_WORLD
    assert first[0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert first[1] == {"id": 7592, "text": "hello", "special": False, "start": 0, "stop": 5}
    assert first[2] == {"id": 2088, "text": "world", "special": False, "start": 6, "stop": 11}
    assert first[3]["special"] and first[3]["text"] == "[SEP]"
    text = "café über"
    for token in second[1:-1]:
        assert token["text"] == text[token["start"] : token["stop"]]
    assert second[-2]["stop"] == len(text)  # code points, not bytes
    # The ids are the ones the model embeds the text with.
    assert [t["id"] for t in second] == worker.model.tokenize([text])[0]
    tokens = len(first) + len(second)
    assert answer["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


async def test_tokenize_without_special_tokens(worker):
    status, answer = await post(
        worker, "/v1/tokenize", {"input": "hello world", "add_special_tokens": False}
    )
    assert status == 200, answer
    (row,) = answer["data"]
    assert [t["id"] for t in row["tokens"]] == HELLO_WORLD[1:-1]
    assert not any(t["special"] for t in row["tokens"])


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "input"),
        ({"input": []}, "input"),
        ({"input": ""}, "input"),
        ({"input": ["a", 3]}, "input[1]"),
        ({"input": "a", "add_special_tokens": "yes"}, "add_special_tokens"),
        ({"input": "a", "truncate": True}, "truncate"),
    ],
)
async def test_bad_tokenize_bodies_are_400_naming_the_field(worker, body, param):
    status, answer = await post(worker, "/v1/tokenize", body)
    assert status == 400, answer
    assert answer["error"]["param"] == param
