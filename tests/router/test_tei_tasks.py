"""TEI's /similarity and /predict, Hugging Face's text-classification task on the root
route, the peers' rerank body on /rerank, and the aliases /v2/rerank and /embeddings, in
memory: the bodies each becomes, the answers' shapes, and the refusals (TEI's router,
router/src/http/types.rs, and huggingface_hub's task types are the reference)."""

from __future__ import annotations

import json

import pytest

from .asgi_client import call
from .fake_core import FakeReply
from .test_tei import assert_tei_error, build, forwarded, worker_like


async def classifier_like(deployment: str, path: str, body: bytes, timeout_s: float | None):
    """A two-label head: every input scores {"no": 0.25, "yes": 0.75} (logits with
    raw_scores: {"no": -1.0, "yes": 2.0})."""
    if path != "/v1/classify":
        return await worker_like(deployment, path, body, timeout_s)
    request = json.loads(body)
    items = request["input"]
    count = 1 if isinstance(items, str) else len(items)
    scores = {"no": -1.0, "yes": 2.0} if request.get("raw_scores") else {"no": 0.25, "yes": 0.75}
    results = [{"index": i, "label": "yes", "probabilities": scores} for i in range(count)]
    answer = {"model": "m", "results": results, "usage": {}}
    return FakeReply(200, {}, json.dumps(answer).encode(), f"{deployment}-0")


async def test_similarity_is_the_cosine_of_the_source_to_each_sentence():
    app, core = build({"primary": 1})
    body = {"inputs": {"source_sentence": "a", "sentences": ["b", "c"]}}
    answer = await call(app, "POST", "/similarity", body)
    assert answer.status == 200, answer.body
    path, native = forwarded(core)
    assert path == "/v1/embeddings" and native == {"input": ["a", "b", "c"], "normalize": True}
    # The fake answers [i + 0.5, -1.25] for row i: cos([0.5,-1.25], [1.5,-1.25]) and so on.
    source = [0.5, -1.25]

    def cosine(other):
        dot = sum(x * y for x, y in zip(source, other, strict=True))
        return dot / (sum(x * x for x in source) * sum(y * y for y in other)) ** 0.5

    assert answer.json() == pytest.approx([cosine([1.5, -1.25]), cosine([2.5, -1.25])])
    root = await call(app, "POST", "/", body)
    assert root.json() == answer.json()


@pytest.mark.parametrize(
    ("body", "status", "error_type", "starts_with"),
    [
        ({"inputs": {"source_sentence": "a"}}, 422, "Validation", "sentences: required"),
        ({"inputs": {"source_sentence": "a", "sentences": []}}, 400, "Empty",
         "inputs.sentences: must not be empty"),
        ({"inputs": {"source_sentence": "", "sentences": ["b"]}}, 400, "Empty",
         "inputs.source_sentence"),
        ({"inputs": "a"}, 422, "Validation", "inputs: expected an object"),
        ({"inputs": {"source_sentence": "a", "sentences": ["b"]}, "parameters": {"x": 1}},
         422, "Validation", "parameters.x: unknown parameter"),
        ({"inputs": {"source_sentence": "a", "sentences": ["b"]}, "normalize": True},
         422, "Validation", "normalize: unknown field"),
    ],
)  # fmt: skip
async def test_bad_similarity_bodies(body, status, error_type, starts_with):
    app, core = build({"primary": 1})
    answer = await call(app, "POST", "/similarity", body)
    assert_tei_error(answer, status, error_type, starts_with)
    assert core.calls == []


@pytest.mark.parametrize(
    ("inputs", "native", "single"),
    [
        ("a", ["a"], True),
        (["a", "b"], [["a", "b"]], True),  # two strings are one pair, as TEI reads them
        (["a", "b", "c"], ["a", "b", "c"], False),
        ([["a", "b"], ["c", "d"]], [["a", "b"], ["c", "d"]], False),
        ([["a", "b"]], [["a", "b"]], False),
    ],
)
async def test_predict_reads_texts_and_pairs_as_tei_does(inputs, native, single):
    app, core = build({"primary": 1}, handler=classifier_like)
    answer = await call(app, "POST", "/predict", {"inputs": inputs})
    assert answer.status == 200, answer.body
    path, body = forwarded(core)
    assert path == "/v1/classify" and body == {"input": native, "raw_scores": False}
    ranked = [{"score": 0.75, "label": "yes"}, {"score": 0.25, "label": "no"}]
    assert answer.json() == (ranked if single else [ranked] * len(native))


@pytest.mark.parametrize(
    ("body", "starts_with"),
    [
        ({"inputs": ["a", ["b", "c"]]}, "inputs: a batch is all texts or all pairs"),
        ({"inputs": [["a", "b", "c"]]}, "inputs[0]: expected a text or a pair"),
        ({"inputs": 3}, "inputs: expected a text"),
        ({"inputs": "a", "top_k": 1}, "top_k: unknown field"),
    ],
)
async def test_bad_predict_bodies(body, starts_with):
    app, _core = build({"primary": 1}, handler=classifier_like)
    answer = await call(app, "POST", "/predict", body)
    assert_tei_error(answer, 422, "Validation", starts_with)


async def test_root_route_text_classification_task():
    card = {"head_task": "sequence", "head_labels": ["no", "yes"]}
    app, core = build({"primary": 1}, handler=classifier_like, card=card)
    answer = await call(app, "POST", "/", {"inputs": "a"})
    assert answer.status == 200, answer.body
    assert answer.json() == [[{"label": "yes", "score": 0.75}, {"label": "no", "score": 0.25}]]
    top = await call(
        app,
        "POST",
        "/",
        {"inputs": ["a", "b"], "parameters": {"top_k": 1, "function_to_apply": "sigmoid"}},
    )
    assert forwarded(core)[1] == {"input": ["a", "b"], "raw_scores": True}
    sigmoid = 1 / (1 + 2.718281828459045**-2.0)
    assert top.json() == [[{"label": "yes", "score": pytest.approx(sigmoid)}]] * 2
    bad = await call(app, "POST", "/", {"inputs": "a", "parameters": {"function_to_apply": "x"}})
    assert_tei_error(bad, 422, "Validation", "parameters.function_to_apply")


async def test_rerank_takes_the_peers_body_and_answers_natively():
    app, core = build({"primary": 1})
    body = {"query": "q", "documents": ["a", "b"], "top_n": 1, "return_documents": True}
    answer = await call(app, "POST", "/rerank", body)
    assert answer.status == 200, answer.body
    assert forwarded(core) == ("/v1/rerank", body)
    assert answer.json()["results"][0] == {
        "index": 1,
        "relevance_score": 0.1,
        "document": {"text": "b"},
    }
    tei = await call(app, "POST", "/rerank", {"query": "q", "texts": ["a", "b"], "top_n": 1})
    assert forwarded(core)[1]["top_n"] == 1 and tei.json()[0]["index"] == 1


@pytest.mark.parametrize(
    ("alias", "native"), [("/v2/rerank", "/v1/rerank"), ("/embeddings", "/v1/embeddings")]
)
async def test_aliases_forward_the_callers_bytes_to_the_native_route(alias, native):
    app, core = build({"primary": 1})
    body = (
        {"model": "primary", "query": "q", "documents": ["a"]}
        if "rerank" in alias
        else {"model": "primary", "input": "a"}
    )
    answer = await call(app, "POST", alias, body)
    assert answer.status == 200, answer.body
    assert forwarded(core) == (native, body)
