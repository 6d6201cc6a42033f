"""Hugging Face's token-classification task on TEI's root route: a body with `inputs` goes to
/v1/classify when the deployment's card says its head labels tokens, to /embed otherwise.
First with a scripted core (which task a card selects), then through a real in-process
worker on a tiny BertForTokenClassification, against transformers' pipeline."""

from __future__ import annotations

import json
import warnings

import pytest
import trio

from sr.config.schema import Deployment, Replica, SrConfig
from sr.events import RecordingSink
from sr.pool import open_router
from sr.router.app import RouterApp
from sr.router.cache import ResultCache
from sr.router.metrics import RouterMetrics
from tests.models.token_models import LABELS, reference_pipeline, write_token_model

from .asgi_client import call
from .fake_core import FakeReply, FakeRouterCore, make_config

ENTITY = {"entity_group": "PER", "score": 0.5, "word": "ada", "start": 0, "end": 3}


async def _classify_or_embed(deployment: str, path: str, body: bytes, timeout_s):
    request = json.loads(body)
    texts = request["input"]
    count = 1 if isinstance(texts, str) else len(texts)
    if path == "/v1/classify":
        results = [{"index": i, "entities": [{**ENTITY, "end": i + 3}]} for i in range(count)]
        answer = {"model": deployment, "results": results[::-1], "usage": {}}
    else:
        assert path == "/v1/embeddings", path
        data = [{"object": "embedding", "index": i, "embedding": [0.5]} for i in range(count)]
        answer = {"object": "list", "model": deployment, "data": data, "usage": {}}
    return FakeReply(200, {}, json.dumps(answer).encode(), f"{deployment}-0")


class CardCore(FakeRouterCore):
    """Cards per deployment (None: no ready replica)."""

    def __init__(self, config, cards):
        super().__init__(config, _classify_or_embed)
        self.cards = cards

    def model_card(self, deployment):
        return self.cards[deployment]


def _app(cards: dict, replicas: dict | None = None):
    config = make_config(replicas or dict.fromkeys(cards, 1))
    core = CardCore(config, cards)
    app = RouterApp(core, config, metrics=RouterMetrics(core.inventory), cache=ResultCache(0))
    return app, core


def _card(head_task):
    labels = list(LABELS) if head_task else None
    return {"head_task": head_task, "head_labels": labels, "embedding_dim": 1}


async def test_the_card_selects_the_task_of_a_root_body_with_inputs():
    app, core = _app({"primary": _card("token")})
    one = await call(app, "POST", "/", {"inputs": "ada", "parameters": {"ignore_labels": []}})
    assert one.status == 200, one.body
    assert one.json() == [ENTITY]  # one text: its entities
    path, body = core.calls[-1][1], json.loads(core.calls[-1][2])
    assert path == "/v1/classify" and body == {"input": "ada", "ignore_labels": []}
    several = await call(app, "POST", "/", {"inputs": ["a", "b"]})
    assert several.json() == [[ENTITY], [{**ENTITY, "end": 4}]]  # in input order
    # /embed stays /embed whatever the head.
    embedded = await call(app, "POST", "/embed", {"inputs": "ada"})
    assert embedded.json() == [[0.5]] and core.calls[-1][1] == "/v1/embeddings"


async def test_a_model_without_a_head_embeds_on_the_root_route():
    app, core = _app({"primary": _card(None)})
    answer = await call(app, "POST", "/", {"inputs": "ada"})
    assert answer.json() == [[0.5]] and core.calls[-1][1] == "/v1/embeddings"


async def test_a_sequence_head_classifies_texts_on_the_root_route():
    app, core = _app({"primary": _card("sequence")})
    await call(app, "POST", "/", {"inputs": "ada"})
    assert core.calls[-1][1] == "/v1/classify"


async def test_the_model_named_picks_the_card():
    app, core = _app({"ner": _card("token"), "embedder": _card(None)})
    await call(app, "POST", "/", {"inputs": "ada", "model": "ner"})
    assert core.calls[-1][:2] == ("ner", "/v1/classify")
    await call(app, "POST", "/", {"inputs": "ada", "model": "embedder"})
    assert core.calls[-1][:2] == ("embedder", "/v1/embeddings")
    missing = await call(app, "POST", "/", {"inputs": "ada", "model": "nope"})
    assert missing.status == 422 and missing.json()["code"] == "model_not_found"
    unnamed = await call(app, "POST", "/", {"inputs": "ada"})
    assert unnamed.status == 422 and unnamed.json()["error"].startswith("model: required")
    assert len(core.calls) == 2


@pytest.mark.parametrize(
    ("parameters", "starts_with"),
    [
        ({"stride": 8}, "parameters.stride"),
        ({"colour": "red"}, "parameters.colour"),
        ("simple", "parameters"),
    ],
)
async def test_bad_parameters_are_refused_before_dispatch(parameters, starts_with):
    app, core = _app({"primary": _card("token")})
    answer = await call(app, "POST", "/", {"inputs": "ada", "parameters": parameters})
    assert answer.status == 422 and answer.json()["error_type"] == "Validation"
    assert answer.json()["error"].startswith(starts_with), answer.json()
    assert not core.calls


# -- a real worker, in process ---------------------------------------------------------------
TEXTS = ["My name is Wolfgang and I live in Berlin.", "Call +1 (555) 010-9999, Zoë!"]


def _pipeline(pipe, text, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pipe(text, **options)


def _assert_same(got, want, what):
    assert len(got) == len(want), f"{what}: {got} != {want}"
    for mine, theirs in zip(got, want, strict=True):
        assert set(mine) == set(theirs), what
        for key, value in theirs.items():
            if key == "score":
                assert abs(mine[key] - float(value)) <= 1e-5, what
            else:
                assert mine[key] == value, f"{what} {key}: {mine} != {theirs}"


async def test_root_route_over_a_real_worker_matches_the_pipeline(tmp_path):
    folder = write_token_model(tmp_path / "ner", "bert", seed=6)
    pipe = reference_pipeline(folder)
    config = SrConfig()
    config.deployments["ner"] = Deployment(artifact=str(folder), replicas=[Replica(device="cpu")])
    answers = {}
    with trio.fail_after(60):
        async with open_router(
            config, events=RecordingSink(), in_process=True, threads=1, run_dir=tmp_path / "run"
        ) as core:
            await core.wait_ready(40)
            app = RouterApp(
                core, config, metrics=RouterMetrics(core.inventory), cache=ResultCache(0),
                fault_injection=False,
            )  # fmt: skip
            for strategy in ("none", "simple", "first"):
                body = {"inputs": TEXTS, "parameters": {"aggregation_strategy": strategy}}
                answers[strategy] = await call(app, "POST", "/", body)
            one = await call(app, "POST", "/", {"inputs": TEXTS[0]})
            bad = await call(
                app, "POST", "/", {"inputs": "x", "parameters": {"aggregation_strategy": "bogus"}}
            )
            info = (await call(app, "GET", "/info")).json()
            embedded = await call(app, "POST", "/embed", {"inputs": TEXTS[0]})
    for strategy, answer in answers.items():
        assert answer.status == 200, answer.body
        for text, got in zip(TEXTS, answer.json(), strict=True):
            want = _pipeline(pipe, text, aggregation_strategy=strategy)
            _assert_same(got, want, f"{strategy} {text!r}")
    _assert_same(one.json(), _pipeline(pipe, TEXTS[0], aggregation_strategy="simple"), "one")
    assert bad.status == 422 and bad.json()["error_type"] == "Validation"
    assert bad.json()["error"].startswith("parameters.aggregation_strategy:"), bad.json()
    assert info["model_type"] == {
        "classifier": {
            "id2label": {str(i): label for i, label in enumerate(LABELS)},
            "label2id": {label: i for i, label in enumerate(LABELS)},
        }
    }
    assert embedded.status == 200 and len(embedded.json()[0]) == 32
