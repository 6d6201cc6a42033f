"""POST /v1/classify on a token-classification head, through an in-process worker (its
engine, cache, warm-up probe and golden check included), against transformers'
token-classification pipeline on the same tiny checkpoint (tests/models/token_models.py):
entities, field errors naming the field, and a cut text's offsets."""

from __future__ import annotations

import warnings

import pytest
import trio
from worker_fakes import passing_golden, post, running

from sr.worker.options import WorkerOptions
from sr.worker.state import WorkerState
from tests.models.token_models import reference_pipeline, write_token_model

TEXTS = [
    "My name is Wolfgang and I live in Berlin.",
    "Call me at +1 (555) 010-9999, Zoë!",
    "  hyperparameterization  ",
]
# Words that are one token each, so that a cut after any of them is a text of its own.
LONG = "Zoë met Wolfgang in Zürich and Berlin on Monday with Sarah and Paris " * 4
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def token_dir(tmp_path_factory):
    return write_token_model(tmp_path_factory.mktemp("token-bert"), "bert", seed=4)


@pytest.fixture(scope="module")
def pipe(token_dir):
    return reference_pipeline(token_dir)


@pytest.fixture
async def token_worker(token_dir):
    async with running(WorkerOptions(artifact=str(token_dir))) as service:  # real golden check
        assert service.state is WorkerState.READY, service.reason
        yield service


def _pipeline(pipe, text: str, **options) -> list[dict]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pipe(text, **options)


def assert_same_entities(got: list[dict], want: list[dict], what: str) -> None:
    assert len(got) == len(want), f"{what}: {got} != {want}"
    for mine, theirs in zip(got, want, strict=True):
        assert set(mine) == set(theirs), what
        for key, value in theirs.items():
            if key == "score":
                assert abs(mine[key] - float(value)) <= 1e-5, what
            else:
                assert mine[key] == value, f"{what} {key}: {mine} != {theirs}"


@pytest.mark.parametrize("strategy", ["none", "simple"])
async def test_entities_match_the_pipeline(token_worker, pipe, strategy):
    body = {"input": TEXTS, "aggregation_strategy": strategy}
    status, answer = await post(token_worker, "/v1/classify", body)
    assert status == 200, answer
    assert answer["model"] == token_worker.options.artifact
    assert [result["index"] for result in answer["results"]] == [0, 1, 2]
    for text, result in zip(TEXTS, answer["results"], strict=True):
        want = _pipeline(pipe, text, aggregation_strategy=strategy)
        assert_same_entities(result["entities"], want, f"{strategy} {text!r}")
    assert answer["usage"]["prompt_tokens"] == sum(
        len(pipe.tokenizer(text)["input_ids"]) for text in TEXTS
    )
    # Again: the engine's cache answers the rows, and the same entities.
    assert await post(token_worker, "/v1/classify", body) == (status, answer)


async def test_the_card_names_the_token_head(token_worker):
    card = token_worker.card()
    assert card["head_task"] == "token" and card["head_activation"] == "softmax"
    assert card["head_labels"][0] == "O"
    assert card["golden"]["status"] != "failed", card["golden"]
    assert card["batching"]["probe"]["passed"], card["batching"]["probe"]


async def test_token_and_embedding_requests_share_the_engine(token_worker, pipe):
    """Requests of both kinds in flight at once: each gets its own kind's answer."""
    answers: dict[str, tuple[int, dict]] = {}

    async def ask(name, path, body):
        answers[name] = await post(token_worker, path, body)

    async with trio.open_nursery() as nursery:
        for i, text in enumerate(TEXTS):
            nursery.start_soon(ask, f"token{i}", "/v1/classify", {"input": text})
            nursery.start_soon(ask, f"embed{i}", "/v1/embeddings", {"input": text})
    for i, text in enumerate(TEXTS):
        status, answer = answers[f"token{i}"]
        assert status == 200, answer
        want = _pipeline(pipe, text, aggregation_strategy="simple")
        assert_same_entities(answer["results"][0]["entities"], want, text)
        status, answer = answers[f"embed{i}"]
        assert status == 200 and len(answer["data"][0]["embedding"]) == 32


BAD = [
    ({"input": "x", "aggregation_strategy": "bogus"}, "aggregation_strategy"),
    ({"input": "x", "aggregation_strategy": 3}, "aggregation_strategy"),
    ({"input": "x", "ignore_labels": "O"}, "ignore_labels"),
    ({"input": "x", "ignore_labels": ["O", 1]}, "ignore_labels"),
    ({"input": "x", "labels": {"a": "a person"}}, "labels"),
    ({"input": "x", "labels": ["PER"]}, "labels"),
    ({"input": "x", "colour": "red"}, "colour"),
    ({"input": ""}, "input"),
    ({"input": ["ok", 3]}, "input[1]"),
    ({"aggregation_strategy": "simple"}, "input"),
]


@pytest.mark.parametrize(("body", "field"), BAD)
async def test_bad_fields_are_400_naming_the_field(token_worker, body, field):
    status, answer = await post(token_worker, "/v1/classify", body)
    assert status == 400, answer
    assert answer["error"]["code"] == "invalid_request"
    assert answer["error"]["message"].startswith(f"{field}:"), answer


async def test_rerank_is_refused_on_a_token_head(token_worker):
    status, answer = await post(token_worker, "/v1/rerank", {"query": "q", "documents": ["a", "b"]})
    assert status == 400 and "token" in answer["error"]["message"]


@pytest.mark.parametrize("field", ["aggregation_strategy", "ignore_labels"])
@pytest.mark.parametrize("head", [True, False])
async def test_a_sequence_or_no_head_refuses_token_fields(
    tiny_head_model_dir, tiny_model_dir, field, head
):
    folder = tiny_head_model_dir if head else tiny_model_dir
    value = "simple" if field == "aggregation_strategy" else ["O"]
    body = {"input": "good", field: value}
    if not head:
        body["labels"] = {"a": "one", "b": "two"}
    async with running(WorkerOptions(artifact=str(folder)), golden_check_fn=passing_golden) as w:
        status, answer = await post(w, "/v1/classify", body)
        assert w.card()["head_task"] == ("sequence" if head else None)
    assert status == 400, answer
    assert answer["error"]["message"].startswith(f"{field}:"), answer


async def test_a_cut_text_keeps_offsets_into_the_callers_text(token_dir, pipe):
    """Over input.max_tokens with overflow truncate: the first tokens and [SEP] are served,
    and each entity is the pipeline's on the text those tokens cover, at the same offsets
    (code points into the whole text)."""
    encoding = pipe.tokenizer(LONG, return_offsets_mapping=True)
    assert len(encoding["input_ids"]) > MAX_TOKENS
    covered = LONG[: encoding["offset_mapping"][MAX_TOKENS - 2][1]]  # [CLS] + 14 tokens
    kept = [*encoding["input_ids"][: MAX_TOKENS - 1], encoding["input_ids"][-1]]
    assert pipe.tokenizer(covered)["input_ids"] == kept  # the cut is a text of its own
    opts = WorkerOptions(artifact=str(token_dir), max_tokens=MAX_TOKENS, overflow="truncate")
    async with running(opts, golden_check_fn=passing_golden) as service:
        for strategy in ("none", "simple", "average"):
            body = {"input": ["short text", LONG], "aggregation_strategy": strategy,
                    "ignore_labels": []}  # fmt: skip
            status, answer = await post(service, "/v1/classify", body)
            assert status == 200, answer
            assert answer["usage"]["truncated_inputs"] == ["input[1]"]
            got = answer["results"][1]["entities"]
            want = _pipeline(pipe, covered, aggregation_strategy=strategy, ignore_labels=[])
            assert_same_entities(got, want, strategy)
            assert got[-1]["end"] == len(covered)
            for entity in got:
                assert LONG[entity["start"] : entity["end"]].lower().replace("ë", "e").replace(
                    "ü", "u"
                ) == entity["word"].replace("##", "")
        # The request's own `truncate: false` refuses it, naming the input.
        status, answer = await post(service, "/v1/classify", {"input": LONG, "truncate": False})
    assert status == 400 and answer["error"]["message"].startswith("input: ")
