"""Per-deployment addressing for clients that never send `model` (TEI's, Cohere's): a URL
`/d/<deployment>/` under which every route answers for that deployment, and `?model=` on
every dispatching route; both agree with a body's `model` or are refused."""

from __future__ import annotations

import json

import pytest

from sr.router.app import RouterApp
from sr.router.cache import ResultCache
from sr.router.metrics import RouterMetrics

from .asgi_client import call
from .fake_core import make_config
from .test_tei import EMBEDDING_CARD, TeiCore, worker_like


def build():
    config = make_config({"embedder": 1, "reranker": 1})
    core = TeiCore(config, worker_like, EMBEDDING_CARD)
    app = RouterApp(
        core, config, metrics=RouterMetrics(core.inventory), cache=ResultCache(0),
        fault_injection=False,
    )  # fmt: skip
    return app, core


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/d/reranker/embed", {"inputs": "a"}),
        ("/d/reranker/", {"inputs": "a"}),
        ("/d/reranker", {"inputs": "a"}),
        ("/embed?model=reranker", {"inputs": "a"}),
        ("/embed?model=/models/reranker", {"inputs": "a"}),  # the artifact, as in a body
        ("/d/reranker/v1/embeddings", {"input": "a"}),
        ("/v1/embeddings?model=reranker", {"input": "a"}),
        ("/d/reranker/embeddings", {"input": "a"}),
        ("/d/reranker/v1/embeddings", {"input": "a", "model": "reranker"}),
        ("/d/reranker/embed?model=reranker", {"inputs": "a"}),
    ],
)
async def test_the_url_picks_the_deployment(path, body):
    app, core = build()
    answer = await call(app, "POST", path, body)
    assert answer.status == 200, answer.body
    assert core.calls[-1][0] == "reranker"


async def test_without_an_address_several_deployments_need_a_model():
    app, _core = build()
    answer = await call(app, "POST", "/embed", {"inputs": "a"})
    assert answer.status == 422
    assert "/d/<deployment>/" in answer.json()["error"]
    native = await call(app, "POST", "/v1/embeddings", {"input": "a"})
    assert native.status == 400 and native.json()["error"]["message"] == "model: field is required"


@pytest.mark.parametrize(
    ("path", "body", "status", "starts_with"),
    [
        ("/d/reranker/embed", {"inputs": "a", "model": "embedder"}, 422, "model: 'embedder'"),
        ("/d/reranker/embed?model=embedder", {"inputs": "a"}, 422, "model: ?model=embedder"),
        ("/embed?model=", {"inputs": "a"}, 422, "model: the query parameter"),
        ("/embed?model=a&model=b", {"inputs": "a"}, 422, "model: give the query parameter once"),
        ("/d/nope/embed", {"inputs": "a"}, 422, "model 'nope'"),
    ],
)
async def test_addresses_that_disagree_or_name_nothing_are_refused(path, body, status, starts_with):
    app, core = build()
    answer = await call(app, "POST", path, body)
    assert answer.status == status, answer.body
    assert answer.json()["error"].startswith(starts_with), answer.json()
    assert core.calls == []


async def test_native_errors_keep_the_native_shape_and_unknown_deployments_are_404():
    app, _core = build()
    answer = await call(app, "POST", "/d/nope/v1/embeddings", {"input": "a"})
    assert answer.status == 404 and answer.json()["error"]["code"] == "model_not_found"


async def test_info_and_unknown_routes_under_a_deployment():
    app, _core = build()
    info = await call(app, "GET", "/d/reranker/info")
    assert info.status == 200 and info.json()["served_model_name"] == "reranker"
    missing = await call(app, "GET", "/d/reranker/nope")
    assert missing.status == 404
    health = await call(app, "GET", "/d/reranker/health")
    assert health.status == 200


async def test_models_and_inventory_show_each_base_path():
    app, _core = build()
    models = (await call(app, "GET", "/v1/models")).json()["data"]
    assert {m["id"]: m["base_path"] for m in models} == {
        "embedder": "/d/embedder/",
        "reranker": "/d/reranker/",
    }
    inventory = (await call(app, "GET", "/api/v1/inventory/model-runtime")).json()
    assert inventory["deployments"]["reranker"]["base_path"] == "/d/reranker/"


async def test_the_forwarded_body_is_the_callers_on_native_routes():
    app, core = build()
    await call(app, "POST", "/d/embedder/v1/embeddings", {"input": "a"})
    assert json.loads(core.calls[-1][2]) == {"input": "a"}  # the worker answers its artifact


class CardsCore(TeiCore):
    """Each deployment with its own card (None: no replica ready yet)."""

    def __init__(self, config, cards):
        super().__init__(config, worker_like, EMBEDDING_CARD)
        self.cards = cards

    def model_card(self, deployment):
        card = self.cards[deployment]
        return None if card is None else dict(card)


CROSS_ENCODER_CARD = {**EMBEDDING_CARD, "head_task": "sequence", "head_labels": ["score"]}
CLASSIFIER_CARD = {**EMBEDDING_CARD, "head_task": "sequence", "head_labels": ["a", "b"]}


def build_with_cards(cards):
    config = make_config({name: 1 for name in cards})
    core = CardsCore(config, cards)
    app = RouterApp(
        core, config, metrics=RouterMetrics(core.inventory), cache=ResultCache(0),
        fault_injection=False,
    )  # fmt: skip
    return app, core


RERANK_BODIES = [
    ("/rerank", {"query": "q", "texts": ["a", "b"]}),
    ("/rerank", {"query": "q", "documents": ["a", "b"], "top_n": 1}),
]


@pytest.mark.parametrize(("path", "body"), RERANK_BODIES)
async def test_a_rerank_body_naming_no_deployment_goes_to_the_only_cross_encoder(path, body):
    app, core = build_with_cards(
        {"embedder": EMBEDDING_CARD, "classifier": CLASSIFIER_CARD, "reranker": CROSS_ENCODER_CARD}
    )
    answer = await call(app, "POST", path, body)
    assert answer.status == 200, answer.body
    assert [c[0] for c in core.calls] == ["reranker"]


@pytest.mark.parametrize(
    "cards",
    [
        {"embedder": EMBEDDING_CARD, "a": CROSS_ENCODER_CARD, "b": CROSS_ENCODER_CARD},
        {"embedder": None, "reranker": CROSS_ENCODER_CARD},  # the embedder's card not known yet
        {"embedder": EMBEDDING_CARD, "classifier": CLASSIFIER_CARD},  # no cross-encoder
    ],
    ids=["two-cross-encoders", "a-card-not-known", "none"],
)
async def test_a_model_less_rerank_body_is_refused_unless_one_cross_encoder_is_sure(cards):
    app, core = build_with_cards(cards)
    answer = await call(app, "POST", "/rerank", {"query": "q", "texts": ["a"]})
    assert answer.status == 422, answer.body
    assert "model: required when several deployments are served" in answer.json()["error"]
    assert core.calls == []


async def test_a_model_less_embedding_body_is_not_sent_to_the_only_embedder():
    """Only rerank: an embedding body fits every deployment, a guess would be a default."""
    app, core = build_with_cards({"embedder": EMBEDDING_CARD, "reranker": CROSS_ENCODER_CARD})
    answer = await call(app, "POST", "/embed", {"inputs": "a"})
    assert answer.status == 422 and core.calls == []
