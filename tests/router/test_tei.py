"""TEI's routes on the router, in memory: the TEI bodies become native worker requests, the
worker's answers become TEI's, errors take TEI's shape and statuses, and the routes go
through the native dispatch (deployment choice, deadline header, cache, hang-up cancel,
replica header, metrics). The last tests run a real in-process worker on the tiny BERT.

TEI's own router (huggingface/text-embeddings-inference router/src/http/types.rs,
server.rs, lib.rs) is the reference for the shapes, defaults and statuses asserted here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import trio
import yaml

from sr.config.schema import Deployment, Replica, SrConfig
from sr.errors import DeadlineExceeded, Overloaded, Unavailable, WorkerFailed
from sr.events import RecordingSink
from sr.pool import open_router
from sr.router import tei
from sr.router.app import RouterApp
from sr.router.cache import ResultCache
from sr.router.metrics import RouterMetrics

from .asgi_client import Answer, call
from .fake_core import FakeReply, FakeRouterCore, make_config

# TEI's Info struct (router/src/lib.rs), field for field.
TEI_INFO_FIELDS = {
    "model_id", "model_sha", "model_dtype", "served_model_name", "model_type",
    "max_concurrent_requests", "max_input_length", "max_batch_tokens", "max_batch_requests",
    "max_client_batch_size", "auto_truncate", "tokenization_workers", "version", "sha",
    "docker_label",
}  # fmt: skip
SR_INFO_FIELDS = {"prompts", "default_prompt_name"}  # sr's additions to TEI's Info
TEI_ERROR_TYPES = {"Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty"}
ARTIFACT = "/models/primary"  # what fake_core.make_config names the artifact
EMBEDDING_CARD = {
    "id": "/models/primary",
    "artifact": "/models/primary",
    "revision": None,
    "dtype": "float32",
    "overflow": "truncate",
    "limits": {"max_num_seqs": 64, "max_num_batched_tokens": 8192, "max_input_tokens": 256},
    "embedding_dim": 2,
    "pooling": ["mean"],
    "head_labels": None,
}


async def worker_like(deployment: str, path: str, body: bytes, timeout_s: float | None):
    """Answer each native route as a worker does, from the forwarded body."""
    request = json.loads(body)
    if path == "/v1/embeddings":
        texts = request["input"]
        count = 1 if isinstance(texts, str) or isinstance(texts[0], int) else len(texts)
        data = [
            {"object": "embedding", "index": i, "embedding": [i + 0.5, -1.25]} for i in range(count)
        ]
        answer = {
            "object": "list",
            "model": request.get("model", ARTIFACT),
            "data": data,
            "usage": {},
        }
    elif path == "/v1/rerank":
        documents = request["documents"]
        results = []
        for index in reversed(range(len(documents))):  # the last document scores highest
            result = {"index": index, "relevance_score": index / 10}
            if request.get("return_documents"):
                result["document"] = {"text": documents[index]}
            results.append(result)
        answer = {"model": request.get("model", ARTIFACT), "results": results, "usage": {}}
    elif path == "/v1/sparse_embeddings":
        texts = request["input"]
        count = 1 if isinstance(texts, str) else len(texts)
        data = [
            {"object": "sparse_embedding", "index": i, "indices": [3, 70 + i], "values": [0.5, i]}
            for i in reversed(range(count))
        ]
        answer = {"object": "list", "model": ARTIFACT, "data": data, "usage": {}}
    elif path == "/v1/tokenize":
        texts = request["input"]
        texts = [texts] if isinstance(texts, str) else texts
        data = [{"index": i, "tokens": _code_point_tokens(text)} for i, text in enumerate(texts)]
        answer = {
            "object": "list",
            "model": request.get("model", ARTIFACT),
            "data": data,
            "usage": {},
        }
    else:
        raise AssertionError(path)
    return FakeReply(200, {}, json.dumps(answer).encode(), f"{deployment}-0")


def _code_point_tokens(text: str) -> list[dict]:
    """Whitespace words with code-point offsets, between [CLS] and [SEP]."""
    special = {"special": True, "start": None, "stop": None}
    tokens = [{"id": 101, "text": "[CLS]", **special}]
    for match in re.finditer(r"\S+", text):
        tokens.append(
            {"id": 1000 + match.start(), "text": match.group(), "special": False,
             "start": match.start(), "stop": match.end()}
        )  # fmt: skip
    return [*tokens, {"id": 102, "text": "[SEP]", **special}]


class TeiCore(FakeRouterCore):
    def __init__(self, config, handler=worker_like, card=EMBEDDING_CARD):
        super().__init__(config, handler)
        self.card = card

    def model_card(self, deployment):
        if deployment not in self.config.deployments:
            raise AssertionError(deployment)
        return None if self.card is None else dict(self.card)


def build(replicas=None, handler=worker_like, card=EMBEDDING_CARD, cache_entries=0):
    config = make_config(replicas or {"primary": 2})
    core = TeiCore(config, handler, card)
    app = RouterApp(
        core,
        config,
        metrics=RouterMetrics(core.inventory),
        cache=ResultCache(cache_entries),
        fault_injection=False,
    )
    return app, core


def forwarded(core, index=-1) -> tuple[str, dict]:
    _deployment, path, body, _timeout = core.calls[index]
    return path, json.loads(body)


def assert_tei_error(answer, status, error_type, starts_with, code=None):
    assert answer.status == status, answer.body
    body = answer.json()
    assert set(body) <= {"error", "error_type", "code", "request_id"}
    assert body["error_type"] == error_type and error_type in TEI_ERROR_TYPES
    assert body["error"].startswith(starts_with), body["error"]
    if code is not None:
        assert body["code"] == code


# -- /embed ----------------------------------------------------------------------------------
async def test_embed_one_text_is_a_list_of_one_vector():
    app, core = build()
    answer = await call(app, "POST", "/embed", {"inputs": "hello"})
    assert answer.status == 200, answer.body
    assert answer.json() == [[0.5, -1.25]]
    assert answer.headers["x-sr-replica"] == "primary-0"
    path, body = forwarded(core)
    # TEI's defaults: normalize true; truncate absent leaves the deployment's overflow.
    assert path == "/v1/embeddings"
    assert body == {"input": "hello", "normalize": True}  # no `model`: the worker's artifact


async def test_embed_fields_map_onto_the_native_ones():
    app, core = build()
    answer = await call(
        app, "POST", "/embed",
        {"inputs": ["a", "b"], "normalize": False, "truncate": True,
         "truncation_direction": "Right", "prompt_name": None, "dimensions": 8,
         "model": "primary"},
    )  # fmt: skip
    assert answer.status == 200, answer.body
    assert answer.json() == [[0.5, -1.25], [1.5, -1.25]]
    _, body = forwarded(core)
    assert body == {
        "input": ["a", "b"], "normalize": False, "truncate": True, "dimensions": 8,
        "model": "primary",  # as named: the worker accepts its deployment's name
    }  # fmt: skip
    await call(app, "POST", "/embed", {"inputs": "a", "truncate": None, "dimensions": None})
    assert forwarded(core)[1] == {"input": "a", "normalize": True}


async def test_prompt_name_goes_to_the_worker():
    app, core = build()
    answer = await call(app, "POST", "/embed", {"inputs": ["a"], "prompt_name": "query"})
    assert answer.status == 200, answer.body
    assert forwarded(core)[1] == {"input": ["a"], "normalize": True, "prompt_name": "query"}
    # /similarity takes it in `parameters`: the prompt goes before the source and sentences.
    body = {"inputs": {"source_sentence": "a", "sentences": ["b"]},
            "parameters": {"prompt_name": "query"}}  # fmt: skip
    answer = await call(app, "POST", "/similarity", body)
    assert answer.status == 200, answer.body
    assert forwarded(core)[1] == {"input": ["a", "b"], "normalize": True, "prompt_name": "query"}
    # /embed_all's tokens are the prompted text's, as /embed pools them.
    request = tei.parse_request("/embed_all", b'{"inputs": ["a"], "prompt_name": "query"}')
    assert request.route == "/v1/token_embeddings"
    assert request.body == {"input": ["a"], "prompt_name": "query"}


async def test_embed_sparse_answers_tei_sparse_values():
    app, core = build()
    answer = await call(
        app, "POST", "/embed_sparse",
        {"inputs": ["a", "b"], "truncate": True, "prompt_name": "query",
         "truncation_direction": "right"},
    )  # fmt: skip
    assert answer.status == 200, answer.body
    assert answer.json() == [
        [{"index": 3, "value": 0.5}, {"index": 70, "value": 0}],
        [{"index": 3, "value": 0.5}, {"index": 71, "value": 1}],
    ]
    assert forwarded(core) == (
        "/v1/sparse_embeddings",
        {"input": ["a", "b"], "truncate": True, "prompt_name": "query"},
    )
    single = await call(app, "POST", "/embed_sparse", {"inputs": "a"})
    assert len(single.json()) == 1 and forwarded(core)[1] == {"input": "a"}
    await call(app, "POST", "/embed_sparse", {"inputs": "a", "truncation_direction": "left"})
    assert forwarded(core)[1] == {"input": "a", "truncation_direction": "left"}
    for body, status, error_type, start in (
        ({"inputs": []}, 400, "Empty", "inputs: "),
        ({"inputs": [1, 2]}, 422, "Validation", "inputs[0]: "),
        ({"inputs": "a", "normalize": True}, 422, "Validation", "normalize: unknown field"),
    ):
        assert_tei_error(await call(app, "POST", "/embed_sparse", body), status, error_type,
                         start, code="invalid_request")  # fmt: skip


async def test_token_ids_are_whole_rows():
    app, core = build()
    one = await call(app, "POST", "/embed", {"inputs": [101, 7592, 102]})
    assert one.json() == [[0.5, -1.25]]
    assert forwarded(core)[1]["input"] == [101, 7592, 102]
    assert forwarded(core)[1]["add_special_tokens"] is False
    several = await call(app, "POST", "/embed", {"inputs": [[101, 102], [101, 7, 102]]})
    assert several.status == 200 and len(several.json()) == 2
    assert forwarded(core)[1]["add_special_tokens"] is False


@pytest.mark.parametrize(
    ("body", "status", "error_type", "starts_with"),
    [
        ({"inputs": []}, 400, "Empty", "inputs: "),
        ({"inputs": ""}, 400, "Empty", "inputs: "),
        ({"inputs": ["a", ""]}, 400, "Empty", "inputs[1]: "),
        ({"inputs": [[1, 2], []]}, 400, "Empty", "inputs[1]: "),
        ({"inputs": ["a", [1, 2]]}, 422, "Validation", "inputs[1]: "),
        ({"inputs": [[1, 2], "a"]}, 422, "Validation", "inputs[1]: "),
        ({"inputs": [None]}, 422, "Validation", "inputs[0]: "),
        ({"inputs": {"text": "a"}}, 422, "Validation", "inputs: "),
        ({}, 422, "Validation", "inputs: "),
        ({"inputs": "a", "normalise": False}, 422, "Validation", "normalise: unknown field"),
        ({"inputs": "a", "normalize": "no"}, 422, "Validation", "normalize: "),
        ({"inputs": "a", "truncate": "yes"}, 422, "Validation", "truncate: "),
        ({"inputs": "a", "truncation_direction": "up"}, 422, "Validation",
         "truncation_direction: expected 'right' or 'left'"),
        ({"inputs": "a", "truncation_direction": "up"}, 422, "Validation",
         "truncation_direction: "),
        ({"inputs": "a", "model": 3}, 422, "Validation", "model: "),
    ],
)  # fmt: skip
async def test_bad_embed_bodies_are_refused_in_tei_shape(body, status, error_type, starts_with):
    app, core = build()
    answer = await call(app, "POST", "/embed", body)
    assert_tei_error(answer, status, error_type, starts_with, code="invalid_request")
    assert core.calls == []


async def test_a_body_that_is_not_json_is_a_validation_error():
    app, _ = build()
    answer = await call(app, "POST", "/embed", b"{not json")
    assert_tei_error(answer, 422, "Validation", "body: not valid JSON")


# -- /rerank ---------------------------------------------------------------------------------
async def test_rerank_maps_texts_and_answers_ranks_highest_first():
    app, core = build()
    answer = await call(
        app, "POST", "/rerank",
        {"query": "q", "texts": ["a", "b", "c"], "return_text": True, "raw_scores": True,
         "truncate": False},
    )  # fmt: skip
    assert answer.status == 200, answer.body
    assert answer.json() == [
        {"index": 2, "score": 0.2, "text": "c"},
        {"index": 1, "score": 0.1, "text": "b"},
        {"index": 0, "score": 0.0, "text": "a"},
    ]
    path, body = forwarded(core)
    assert path == "/v1/rerank"
    assert body == {
        "query": "q", "documents": ["a", "b", "c"], "raw_scores": True,
        "return_documents": True, "truncate": False,
    }  # fmt: skip
    plain = await call(app, "POST", "/rerank", {"query": "q", "texts": ["a"]})
    assert plain.json() == [{"index": 0, "score": 0.0}]  # no text unless asked (TEI's default)
    assert forwarded(core)[1]["raw_scores"] is False


@pytest.mark.parametrize(
    ("body", "status", "error_type", "starts_with"),
    [
        ({"query": "q", "texts": []}, 400, "Empty", "texts: "),
        ({"query": "", "texts": ["a"]}, 400, "Empty", "query: "),
        ({"query": "q", "texts": "a"}, 422, "Validation", "texts: "),
        ({"query": "q", "texts": ["a", 2]}, 422, "Validation", "texts[1]: "),
        ({"query": "q"}, 422, "Validation", "texts: required"),
        ({"query": "q", "texts": ["a"], "top_k": 1}, 422, "Validation", "top_k: unknown field"),
        ({"query": "q", "texts": ["a"], "return_text": 1}, 422, "Validation", "return_text: "),
    ],
)
async def test_bad_rerank_bodies(body, status, error_type, starts_with):
    app, core = build()
    answer = await call(app, "POST", "/rerank", body)
    assert_tei_error(answer, status, error_type, starts_with)
    assert core.calls == []


# -- /tokenize -------------------------------------------------------------------------------
async def test_tokenize_answers_byte_offsets_as_tei():
    app, core = build()
    text = "café über x"
    answer = await call(app, "POST", "/tokenize", {"inputs": [text, "plain words"]})
    assert answer.status == 200, answer.body
    assert forwarded(core) == (
        "/v1/tokenize",
        {"input": [text, "plain words"], "add_special_tokens": True},
    )
    first, second = answer.json()
    assert first[0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    encoded = text.encode()
    words = [token for token in first if not token["special"]]
    assert [(t["start"], t["stop"]) for t in words] == [(0, 5), (6, 11), (12, 13)]
    for token in words:  # TEI slices the UTF-8 bytes of the input
        assert encoded[token["start"] : token["stop"]].decode() == token["text"]
    assert [(t["start"], t["stop"]) for t in second if not t["special"]] == [(0, 5), (6, 11)]
    single = await call(app, "POST", "/tokenize", {"inputs": "x", "add_special_tokens": False})
    assert len(single.json()) == 1
    assert forwarded(core)[1]["add_special_tokens"] is False


@pytest.mark.parametrize(
    ("body", "status", "error_type", "starts_with"),
    [
        ({"inputs": []}, 400, "Empty", "inputs: "),
        ({"inputs": [1, 2]}, 422, "Validation", "inputs[0]: "),
        ({"inputs": "a", "prompt_name": "query"}, 422, "Validation", "prompt_name: "),
        ({"inputs": "a", "add_special_tokens": None}, 422, "Validation", "add_special_tokens: "),
    ],
)
async def test_bad_tokenize_bodies(body, status, error_type, starts_with):
    app, _ = build()
    answer = await call(app, "POST", "/tokenize", body)
    assert_tei_error(answer, status, error_type, starts_with)


# -- POST / ----------------------------------------------------------------------------------
async def test_root_route_reads_the_task_off_the_body():
    app, core = build()
    embedded = await call(app, "POST", "/", {"inputs": ["a", "b"]})
    assert embedded.json() == [[0.5, -1.25], [1.5, -1.25]]
    assert forwarded(core)[0] == "/v1/embeddings"
    ranked = await call(app, "POST", "/", {"query": "q", "texts": ["a", "b"]})
    assert [rank["index"] for rank in ranked.json()] == [1, 0]
    assert forwarded(core)[0] == "/v1/rerank"
    neither = await call(app, "POST", "/", {"query": "q"})
    assert_tei_error(neither, 422, "Validation", "body: POST / takes an embed body")
    assert len(core.calls) == 2


async def test_tei_routes_take_post_only():
    app, _ = build()
    for path in ("/embed", "/rerank", "/tokenize", "/"):
        answer = await call(app, "GET", path)
        assert answer.status == 405 and answer.headers["allow"] == "POST"
    answer = await call(app, "POST", "/info", {})
    assert answer.status == 405 and answer.headers["allow"] == "GET"


# -- which deployment ------------------------------------------------------------------------
async def test_several_deployments_need_a_model():
    app, core = build({"primary": 1, "other": 1})
    answer = await call(app, "POST", "/embed", {"inputs": "a"})
    assert_tei_error(answer, 422, "Validation", "model: required", code="invalid_request")
    assert "other, primary" in answer.json()["error"]
    named = await call(app, "POST", "/embed", {"inputs": "a", "model": "/models/other"})
    assert named.status == 200
    assert core.calls[-1][0] == "other"
    unknown = await call(app, "POST", "/embed", {"inputs": "a", "model": "nope"})
    assert_tei_error(unknown, 422, "Validation", "model 'nope'", code="model_not_found")


# -- errors from the pool and the worker -----------------------------------------------------
def raising(error):
    async def handler(deployment, path, body, timeout_s):
        raise error

    return handler


@pytest.mark.parametrize(
    ("error", "status", "error_type", "code", "outcome"),
    [
        (Overloaded("every replica is at its limit"), 429, "Overloaded", "overloaded",
         "overloaded"),
        (Unavailable("no ready replica"), 503, "Unhealthy", "unavailable", "unavailable"),
        (WorkerFailed("worker closed the connection"), 424, "Backend", "worker_failed", "failed"),
        (DeadlineExceeded("deadline passed"), 504, "Backend", "timeout", "timeout"),
    ],
)  # fmt: skip
async def test_pool_errors_take_tei_statuses(error, status, error_type, code, outcome):
    app, _ = build(handler=raising(error))
    answer = await call(app, "POST", "/embed", {"inputs": "a"})
    assert_tei_error(answer, status, error_type, error.message, code=code)
    if code == "overloaded":
        assert answer.headers["retry-after"] == "1"
    line = f'sr_requests_total{{deployment="primary",outcome="{outcome}",route="/embed"}} 1.0'
    assert line in app.metrics.render().decode()


def worker_answering(status: int, code: str, message: str):
    async def handler(deployment, path, body, timeout_s):
        error = {"code": code, "message": message, "type": "x", "param": None}
        return FakeReply(status, {}, json.dumps({"error": error}).encode(), "primary-1")

    return handler


@pytest.mark.parametrize(
    ("path", "body", "worker", "status", "error_type", "message"),
    [
        ("/embed", {"inputs": ["a", "b"]},
         (400, "invalid_request", "input[1]: 300 tokens exceed input.max_tokens 256"),
         413, "Validation", "inputs[1]: 300 tokens exceed"),
        ("/embed", {"inputs": "a", "dimensions": 9},
         (400, "invalid_request", "dimensions: 9 exceeds this model's embedding size 2"),
         422, "Validation", "dimensions: 9 exceeds"),
        ("/embed", {"inputs": ["a"] * 3},
         (413, "request_too_large", "input: 3000 items; the limit is 2048 per request"),
         413, "Validation", "inputs: 3000 items"),
        ("/rerank", {"query": "q", "texts": ["a"]},
         (400, "invalid_request", "documents[0]: 300 tokens with the query exceed"),
         422, "Validation", "texts[0]: 300 tokens"),
        ("/rerank", {"query": "q", "texts": ["a"]},
         (500, "worker_failed", "forward failed: RuntimeError: boom"),
         424, "Backend", "forward failed"),
        ("/tokenize", {"inputs": ["a"]},
         (503, "unavailable", "worker is loading"), 503, "Unhealthy", "worker is loading"),
    ],
)  # fmt: skip
async def test_worker_errors_take_tei_shape_and_field_names(
    path, body, worker, status, error_type, message
):
    app, _ = build(handler=worker_answering(*worker))
    answer = await call(app, "POST", path, body)
    assert_tei_error(answer, status, error_type, message, code=worker[1])
    assert answer.headers["x-sr-replica"] == "primary-1"


# -- the shared dispatch ---------------------------------------------------------------------
async def test_deadline_header_and_its_errors():
    app, core = build()
    answer = await call(app, "POST", "/embed", {"inputs": "a"}, {"X-Request-Timeout-Ms": "1500"})
    assert answer.status == 200
    assert core.calls[-1][3] == 1.5
    bad = await call(app, "POST", "/embed", {"inputs": "a"}, {"X-Request-Timeout-Ms": "soon"})
    assert_tei_error(bad, 422, "Validation", "X-Request-Timeout-Ms: ")


async def test_single_replica_deployments_answer_repeats_from_the_cache():
    app, core = build({"primary": 1}, cache_entries=8)
    first = await call(app, "POST", "/embed", {"inputs": ["a", "b"]})
    again = await call(app, "POST", "/embed", {"inputs": ["a", "b"]})
    assert len(core.calls) == 1
    assert again.json() == first.json() == [[0.5, -1.25], [1.5, -1.25]]
    assert again.headers["x-sr-replica"] == "cache"
    other = await call(app, "POST", "/embed", {"inputs": ["a", "b"], "normalize": False})
    assert other.status == 200 and len(core.calls) == 2  # another request, not a hit


async def test_caller_hanging_up_cancels_the_dispatch():
    started, cancelled = trio.Event(), []

    async def stalling(deployment, path, body, timeout_s):
        started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled.append(path)
            raise

    app, _ = build(handler=stalling)
    hang_up = trio.Event()
    got = []

    async def request():
        got.append(await call(app, "POST", "/rerank", {"query": "q", "texts": ["a"]}, None, 1,
                              hang_up))  # fmt: skip

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(request)
            await started.wait()
            hang_up.set()
    assert got == [None] and cancelled == ["/v1/rerank"]
    line = 'sr_requests_total{deployment="primary",outcome="canceled",route="/rerank"} 1.0'
    assert line in app.metrics.render().decode()


async def test_metrics_label_the_tei_route():
    app, _ = build()
    await call(app, "POST", "/embed", {"inputs": "a"})
    await call(app, "POST", "/", {"inputs": "a"})
    text = app.metrics.render().decode()
    assert 'sr_requests_total{deployment="primary",outcome="ok",route="/embed"} 1.0' in text
    assert 'sr_requests_total{deployment="primary",outcome="ok",route="/"} 1.0' in text


# -- GET /info -------------------------------------------------------------------------------
async def test_info_of_an_embedding_deployment():
    app, _ = build()
    answer = await call(app, "GET", "/info")
    assert answer.status == 200, answer.body
    info = answer.json()
    # TEI's fields, and sr's: the folder's prompts, which prompt_name names.
    assert set(info) == TEI_INFO_FIELDS | SR_INFO_FIELDS
    assert info["prompts"] is None and info["default_prompt_name"] is None
    assert info["model_id"] == "/models/primary" and info["model_sha"] is None
    assert info["model_dtype"] == "float32" and info["served_model_name"] == "primary"
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_concurrent_requests"] == 2 * 32  # two ready replicas
    assert info["max_input_length"] == 256 and info["max_batch_tokens"] == 8192
    assert info["max_batch_requests"] == 64 and info["max_client_batch_size"] == 2048
    assert info["auto_truncate"] is True and info["tokenization_workers"] == 2
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", info["version"])


@pytest.mark.parametrize(
    ("labels", "model_type"),
    [
        (["score"], {"reranker": {"id2label": {"0": "score"}, "label2id": {"score": 0}}}),
        (["neg", "pos"], {"classifier": {"id2label": {"0": "neg", "1": "pos"},
                                         "label2id": {"neg": 0, "pos": 1}}}),
    ],
)  # fmt: skip
async def test_info_model_type_of_a_head(labels, model_type):
    card = {**EMBEDDING_CARD, "head_labels": labels, "revision": "abc123", "overflow": "reject"}
    app, _ = build(card=card)
    info = (await call(app, "GET", "/info")).json()
    assert info["model_type"] == model_type
    assert info["model_sha"] == "abc123" and info["auto_truncate"] is False


async def test_info_pooling_names_as_tei_spells_them():
    card = {**EMBEDDING_CARD, "pooling": ["lasttoken"]}
    app, _ = build(card=card)
    info = (await call(app, "GET", "/info")).json()
    assert info["model_type"] == {"embedding": {"pooling": "last_token"}}


async def test_info_lists_prompts_and_splade_pooling():
    prompts = {"texts": {"query": "query: ", "document": ""}, "default_prompt_name": "query"}
    sparse = {"pooling": "max", "activation": "relu", "max_active_dims": None}
    app, _ = build(card={**EMBEDDING_CARD, "prompts": prompts, "sparse": sparse})
    info = (await call(app, "GET", "/info")).json()
    assert info["prompts"] == {"query": "query: ", "document": ""}
    assert info["default_prompt_name"] == "query"
    assert info["model_type"] == {"embedding": {"pooling": "splade"}}


async def test_info_without_a_ready_replica_is_unhealthy():
    app, _ = build(card=None)
    answer = await call(app, "GET", "/info")
    assert_tei_error(answer, 503, "Unhealthy", "deployment 'primary' has no ready replica")


async def test_info_of_one_of_several_deployments():
    app, _ = build({"primary": 1, "other": 3})
    missing = await call(app, "GET", "/info")
    assert_tei_error(missing, 422, "Validation", "model: required")
    answer = await _get_with_query(app, "/info", b"model=other")
    assert answer.status == 200
    info = answer.json()
    assert info["served_model_name"] == "other" and info["max_concurrent_requests"] == 3 * 32


async def _get_with_query(app, path: str, query: bytes):
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "headers": [], "query_string": query}
    await app(scope, receive, send)
    headers = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    return Answer(sent[0]["status"], headers, b"".join(m.get("body", b"") for m in sent[1:]))


def test_openapi_describes_the_tei_routes():
    spec_file = Path(__file__).parents[2] / "sr" / "router" / "openapi.yaml"
    spec = yaml.safe_load(spec_file.read_text())
    for path in tei.POST_ROUTES:
        assert "post" in spec["paths"][path], path
    assert "get" in spec["paths"][tei.INFO_PATH]
    assert "post" in spec["paths"]["/v1/tokenize"]
    schemas = spec["components"]["schemas"]
    assert set(schemas["TeiInfo"]["properties"]) == TEI_INFO_FIELDS | SR_INFO_FIELDS
    assert set(schemas["TeiErrorBody"]["properties"]["error_type"]["enum"]) == TEI_ERROR_TYPES


# -- a real worker, in process ---------------------------------------------------------------
async def test_tei_routes_over_a_real_in_process_worker(tiny_model_dir, tmp_path):
    config = SrConfig()
    config.deployments["primary"] = Deployment(
        artifact=str(tiny_model_dir), replicas=[Replica(device="cpu")]
    )
    with trio.fail_after(30):
        async with open_router(
            config, events=RecordingSink(), in_process=True, threads=1, run_dir=tmp_path / "run"
        ) as core:
            await core.wait_ready(20)
            app = RouterApp(
                core, config, metrics=RouterMetrics(core.inventory), cache=ResultCache(0),
                fault_injection=False,
            )  # fmt: skip
            info = (await call(app, "GET", "/info")).json()
            texts = ["hello world", "naïve café"]
            unit = (await call(app, "POST", "/embed", {"inputs": texts})).json()
            raw = (await call(app, "POST", "/", {"inputs": texts, "normalize": False})).json()
            native = await call(app, "POST", "/v1/embeddings", {"model": "primary", "input": texts})
            tokens = (await call(app, "POST", "/tokenize", {"inputs": texts[1]})).json()
            as_ids = [t["id"] for t in tokens[0]]
            from_ids = (await call(app, "POST", "/embed", {"inputs": as_ids})).json()
    assert info["model_id"] == str(tiny_model_dir)
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 128 and info["auto_truncate"] is False
    assert unit == [row["embedding"] for row in native.json()["data"]]
    for vector, normalized in zip(raw, unit, strict=True):
        norm = sum(x * x for x in vector) ** 0.5
        assert [x / norm for x in vector] == pytest.approx(normalized, rel=1e-5, abs=1e-7)
    encoded = texts[1].encode()
    for token in tokens[0][1:-1]:
        assert encoded[token["start"] : token["stop"]].decode() == token["text"]
    assert from_ids == unit[1:]  # /tokenize's ids embed as the text itself
