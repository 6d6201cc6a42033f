"""Request validation and answers of the three tasks, on the tiny checkpoint in-process."""

from __future__ import annotations

import base64
import json
import math
import struct

import pytest
import torch
import trio
from worker_fakes import passing_golden, post, running

from sr.errors import MethodNotAllowed
from sr.http.hop import Hop
from sr.models.testing import write_tiny_bert
from sr.worker.options import WorkerOptions
from sr.worker.state import WorkerState
from sr.worker.validation import MAX_BODY_BYTES, MAX_INPUTS
from tests.float32 import as_float32


def options(model_dir, **kw) -> WorkerOptions:
    return WorkerOptions(artifact=str(model_dir), **kw)


@pytest.fixture
async def head_worker(tiny_head_model_dir):
    async with running(options(tiny_head_model_dir), golden_check_fn=passing_golden) as service:
        assert service.state is WorkerState.READY, service.reason
        yield service


BAD_BODIES = [
    ("/v1/embeddings", b"\xff\xfe\x00", "UTF-8"),
    ("/v1/embeddings", b"{not json", "JSON"),
    ("/v1/embeddings", b"[" * 100_000 + b"]" * 100_000, "body"),
    ("/v1/embeddings", b'"just a string"', "body"),
    ("/v1/embeddings", {"model": "m"}, "input"),
    ("/v1/embeddings", {"input": 3}, "input"),
    ("/v1/embeddings", {"input": []}, "input"),
    ("/v1/embeddings", {"input": ""}, "input"),
    ("/v1/embeddings", {"input": ["ok", "   "]}, "input[1]"),
    ("/v1/embeddings", {"input": ["ok", 7]}, "input[1]"),
    ("/v1/embeddings", {"input": "\ud800"}, "input"),
    ("/v1/embeddings", {"input": "x", "colour": "red"}, "colour"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "hex"}, "encoding_format"),
    ("/v1/embeddings", {"input": "x", "model": 5}, "model"),
    ("/v1/classify", {"input": "x", "labels": []}, "labels"),
    ("/v1/classify", {"input": "x", "labels": {}}, "labels"),
    ("/v1/classify", {"input": "x", "labels": {"a": 1}}, "labels.a"),
    ("/v1/classify", {"input": "x"}, "labels"),  # no head of its own
    ("/v1/decisions", {"state": "s"}, "questions"),
    ("/v1/decisions", {"state": 1, "questions": {}}, "state"),
    ("/v1/decisions", {"state": "s", "questions": {}}, "questions"),
    ("/v1/decisions", {"state": "s", "questions": {"q": []}}, "questions.q"),
    (
        "/v1/decisions",
        {"state": "s", "questions": {"q": {"criteria": {"a": "b"}}}},
        "questions.q.type",
    ),
    (
        "/v1/decisions",
        {"state": "s", "questions": {"q": {"type": "rank", "criteria": {"a": "b"}}}},
        "questions.q.type",
    ),
    (
        "/v1/decisions",
        {"state": "s", "questions": {"q": {"type": "choice", "criteria": {"a": ""}}}},
        "questions.q.criteria.a",
    ),
    (
        "/v1/decisions",
        {"state": "s", "questions": {"q": {"type": "choice", "criteria": {"a": "b"}, "why": 1}}},
        "questions.q.why",
    ),
]


@pytest.mark.parametrize(("path", "body", "field"), BAD_BODIES)
async def test_bad_requests_are_400_naming_the_field(worker, path, body, field):
    status, answer = await post(worker, path, body)
    assert status == 400, answer
    assert answer["error"]["code"] == "invalid_request"
    assert field in answer["error"]["message"]
    # and the worker still answers
    status, _ = await post(worker, "/v1/embeddings", {"input": "still alive"})
    assert status == 200


async def test_size_caps_are_413(worker):
    status, answer = await post(worker, "/v1/embeddings", b" " * (MAX_BODY_BYTES + 1))
    assert status == 413 and answer["error"]["code"] == "request_too_large"
    status, answer = await post(worker, "/v1/embeddings", {"input": ["a"] * (MAX_INPUTS + 1)})
    assert status == 413 and "input" in answer["error"]["message"]
    status, answer = await post(worker, "/v1/embeddings", {"input": ["ok", "x" * 200_000]})
    assert status == 413 and "input[1]" in answer["error"]["message"]


async def test_embeddings_answer_shape_and_base64(worker):
    status, answer = await post(worker, "/v1/embeddings", {"input": ["hello world", "hi"]})
    assert status == 200
    assert answer["object"] == "list" and answer["model"] == worker.options.artifact
    assert [d["index"] for d in answer["data"]] == [0, 1]
    vector = answer["data"][0]["embedding"]
    assert len(vector) == worker.model.embedding_dim
    assert math.isclose(math.fsum(x * x for x in vector), 1.0, rel_tol=1e-5)  # Normalize
    assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] > 0
    status, b64 = await post(
        worker, "/v1/embeddings", {"input": "hello world", "encoding_format": "base64"}
    )
    raw = base64.b64decode(b64["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(vector)}f", raw)) == as_float32(vector)


async def test_overflow_reject_names_the_input_index(tiny_model_dir):
    opts = options(tiny_model_dir, max_tokens=8)
    async with running(opts, golden_check_fn=passing_golden) as service:
        status, answer = await post(
            service, "/v1/embeddings", {"input": ["short", "one two three four five six seven"]}
        )
    assert status == 400
    assert answer["error"]["message"].startswith("input[1]: ")
    assert "max_tokens 8" in answer["error"]["message"]


async def test_overflow_truncate_reports_in_usage(tiny_model_dir):
    opts = options(tiny_model_dir, max_tokens=8, overflow="truncate")
    long_text = "one two three four five six seven eight nine"
    async with running(opts, golden_check_fn=passing_golden) as service:
        status, answer = await post(service, "/v1/embeddings", {"input": ["short", long_text]})
        _, cut = await post(service, "/v1/embeddings", {"input": "one two three four five six"})
    assert status == 200
    assert answer["usage"]["truncated_inputs"] == ["input[1]"]
    assert answer["usage"]["prompt_tokens"] == 3 + 8  # [CLS] short [SEP] + 8 kept tokens
    # the kept tokens of the long text are exactly "[CLS] one .. six [SEP]"
    assert answer["data"][1]["embedding"] == cut["data"][0]["embedding"]


def _one_question(state: str, instructions: str) -> dict:
    question = {"type": "choice", "instructions": instructions, "criteria": {"a": "one"}}
    return {"state": state, "questions": {"q": question}}


async def test_decisions_reject_names_an_overlong_state_not_the_instructions(tiny_model_dir):
    opts = options(tiny_model_dir, max_tokens=8)
    async with running(opts, golden_check_fn=passing_golden) as service:
        long_state = "one two three four five six seven"  # 9 tokens on its own
        status, answer = await post(service, "/v1/decisions", _one_question(long_state, "short"))
        assert status == 400
        assert answer["error"]["message"].startswith("state: 9 tokens exceed")
        # a short state that only overflows once the instructions are prepended
        status, answer = await post(
            service, "/v1/decisions", _one_question("short", "one two three four five six")
        )
    assert status == 400
    assert answer["error"]["message"].startswith("questions.q (instructions + state): ")


async def test_decisions_truncate_names_the_combined_row(tiny_model_dir):
    opts = options(tiny_model_dir, max_tokens=8, overflow="truncate")
    async with running(opts, golden_check_fn=passing_golden) as service:
        status, answer = await post(
            service, "/v1/decisions", _one_question("short", "one two three four five six")
        )
    assert status == 200
    assert answer["usage"]["truncated_inputs"] == ["questions.q (instructions + state)"]


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/embeddings", {"input": "x"}),
        ("/v1/classify", {"input": "x", "labels": {"a": "one", "b": "two"}}),
        ("/v1/decisions", _one_question("short", "one")),
    ],
)
async def test_a_body_naming_another_model_is_404(worker, path, body):
    status, answer = await post(worker, path, {**body, "model": "someone/else"})
    assert status == 404 and answer["error"]["code"] == "model_not_found"
    assert "'someone/else'" in answer["error"]["message"]
    assert repr(worker.options.artifact) in answer["error"]["message"]
    for name in (worker.options.artifact, worker.options.artifact + "/"):
        status, answer = await post(worker, path, {**body, "model": name})
        assert status == 200 and answer["model"] == name


@pytest.mark.parametrize("path", ["/v1/embeddings", "/v1/classify", "/v1/tokenize"])
async def test_the_routers_deployment_name_is_accepted_and_echoed(worker, path):
    """sr.worker.served_as: the router says which deployment it serves the request for;
    that name is good for `model` on that request only, and the answer carries it."""
    body = {
        "/v1/embeddings": {"input": "x"},
        "/v1/classify": {"input": "x", "labels": {"a": "one", "b": "two"}},
        "/v1/tokenize": {"input": "x"},
    }[path]
    raw = json.dumps({**body, "model": "minilm"}).encode()
    status, _, payload = await worker.handle("POST", path, raw, Hop("r-1", "minilm"))
    assert status == 200 and json.loads(payload)["model"] == "minilm"
    status, _, payload = await worker.handle("POST", path, raw, Hop("r-2", "other"))
    message = json.loads(payload)["error"]["message"]
    assert status == 404 and "as deployment 'other'" in message
    status, _, payload = await worker.handle("POST", path, raw)  # a direct caller
    assert (
        status == 404 and "'minilm' is not served here" in json.loads(payload)["error"]["message"]
    )
    status, _, payload = await worker.handle(
        "POST", path, json.dumps(body).encode(), Hop(None, "minilm")
    )
    assert status == 200 and json.loads(payload)["model"] == worker.options.artifact


async def test_zero_shot_classify_probabilities(worker):
    labels = {"greeting": "hello there", "billing": "invoice payment"}
    status, answer = await post(
        worker, "/v1/classify", {"input": ["hello there", "invoice payment"], "labels": labels}
    )
    assert status == 200
    first, second = answer["results"]
    assert (first["index"], first["label"]) == (0, "greeting")  # identical text: cosine 1
    assert second["label"] == "billing"
    for result in answer["results"]:
        assert list(result["probabilities"]) == ["greeting", "billing"]
        assert math.isclose(sum(result["probabilities"].values()), 1.0, rel_tol=1e-9)


async def test_a_label_key_is_any_string_the_empty_one_too(worker):
    """A key only names its entry in the answer (and OpenAPI 3.0 cannot constrain keys)."""
    status, answer = await post(
        worker, "/v1/classify", {"input": "hello there", "labels": {"": "hello there", "b": "x"}}
    )
    assert status == 200, answer
    assert answer["results"][0]["label"] == ""


async def test_classify_with_the_checkpoint_head(head_worker):
    status, answer = await post(head_worker, "/v1/classify", {"input": ["good", "bad"]})
    assert status == 200
    for result in answer["results"]:
        assert list(result["probabilities"]) == ["negative", "neutral", "positive"]
        best = max(result["probabilities"], key=result["probabilities"].get)
        assert result["label"] == best


async def test_decisions_answer_every_question_in_one_submission(worker):
    body = {
        "state": "please refund my invoice",
        "questions": {
            "route": {
                "type": "choice",
                "criteria": {"billing": "please refund my invoice", "chat": "tell me a joke"},
            },
            "tone": {
                "type": "choice",
                "instructions": "judge the tone",
                "criteria": {"calm": "calm", "angry": "angry"},
            },
        },
    }
    forwards = worker.engine.forwards
    status, answer = await post(worker, "/v1/decisions", body)
    assert status == 200
    route = answer["answers"]["route"]
    assert route["type"] == "choice" and route["choice"] == "billing"
    assert route["confidence"] == max(route["probabilities"].values())
    assert set(answer["answers"]["tone"]["probabilities"]) == {"calm", "angry"}
    # one submission: its 5 distinct rows fit the limits, so they share a single forward
    assert worker.engine.forwards - forwards == 1


async def test_unknown_route_and_wrong_method(worker):
    status, headers, payload = await worker.handle("GET", "/nope", b"")
    assert status == 404 and json.loads(payload)["error"]["code"] == "not_found"
    status, headers, payload = await worker.handle("GET", "/v1/embeddings", b"")
    assert status == 405 and (b"allow", b"POST") in headers
    # written by the one writer, the Allow field carried by the error itself
    refused = MethodNotAllowed("/v1/embeddings takes POST", headers={"Allow": "POST"})
    assert (status, headers, payload) == refused.answer()
    status, _, _ = await worker.handle("POST", "/admin/faults", b'{"mode":"fail"}')
    assert status == 404  # fault injection is off


async def test_concurrent_requests_get_their_unbatched_answers(tiny_model_dir):
    texts = [f"request number {i} " + "word " * i for i in range(8)]
    async with running(options(tiny_model_dir), golden_check_fn=passing_golden) as service:
        alone = [(await post(service, "/v1/embeddings", {"input": t}))[1] for t in texts]
        service.engine.cache.__init__(
            service.engine.cache.capacity
        ) if service.engine.cache else None
        before = service.engine.forwards
        together: dict[int, dict] = {}

        async def one(i):
            together[i] = (await post(service, "/v1/embeddings", {"input": texts[i]}))[1]

        async with trio.open_nursery() as nursery:
            for i in range(len(texts)):
                nursery.start_soon(one, i)
        forwards = service.engine.forwards - before
        card = service.card()
    for i in range(len(texts)):
        assert together[i]["data"] == alone[i]["data"]
    if card["batching"]["cross_request"]:
        assert forwards < len(texts), forwards  # rows of several requests shared forwards
    else:
        assert forwards == len(texts)


@pytest.mark.parametrize(
    ("labels", "problem_type", "activation"),
    [
        (["relevant"], None, "sigmoid"),  # a single logit: a cross-encoder's score
        (["spam", "urgent"], "multi_label_classification", "sigmoid"),
        (["spam", "urgent"], None, "softmax"),
    ],
)
async def test_head_probabilities_follow_the_heads_training(
    tmp_path, labels, problem_type, activation
):
    folder = write_tiny_bert(tmp_path / "head", with_head=True, labels=labels)
    if problem_type is not None:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "problem_type": problem_type}))
    async with running(options(folder), golden_check_fn=passing_golden) as service:
        status, answer = await post(service, "/v1/classify", {"input": ["good", "bad"]})
        logits = service.model.classify_logits(service.model.tokenize(["good", "bad"]))
    assert status == 200 and service.card()["head_activation"] == activation
    want = torch.sigmoid(logits) if activation == "sigmoid" else torch.softmax(logits, dim=1)
    for result, row in zip(answer["results"], want.tolist(), strict=True):
        assert list(result["probabilities"]) == labels
        assert list(result["probabilities"].values()) == pytest.approx(row, abs=1e-6)
