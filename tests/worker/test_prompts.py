"""Prompts on the worker, in process, against sentence-transformers' own encode: a folder's
`prompts` named by `prompt_name` (or Jina's `task`), its `default_prompt_name` applied when
none is named, `include_prompt: false` leaving the prompt's tokens out of pooling, refusals
naming the known prompts, and the prompt's tokens counted in limits and usage."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from worker_fakes import get, passing_golden, post, running

from sr.worker.options import WorkerOptions
from sr.worker.state import WorkerState
from tests.float32 import as_float32
from tests.models.st_reference import encode

TOLERANCE = 1e-5
TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog.", "what is sr?"]
PROMPTS = {"query": "query: ", "passage": "passage: ", "retrieval.query": "Represent the query: "}


def _with_prompts(source, folder, *, default=None, pooling_changes=None):
    shutil.copytree(source, folder)
    config = {"prompts": PROMPTS, "default_prompt_name": default}
    (folder / "config_sentence_transformers.json").write_text(json.dumps(config))
    if pooling_changes:
        path = folder / "1_Pooling" / "config.json"
        pooling = json.loads(path.read_text())
        for key in pooling:
            if key.startswith("pooling_mode"):
                pooling[key] = False
        pooling.update(pooling_changes)
        path.write_text(json.dumps(pooling))
    return folder


@pytest.fixture(scope="module")
def prompted_dir(tiny_model_dir, tmp_path_factory):
    return _with_prompts(tiny_model_dir, tmp_path_factory.mktemp("prompted") / "model")


@pytest.fixture(scope="module")
def default_dir(tiny_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("default-prompt") / "model"
    return _with_prompts(tiny_model_dir, folder, default="query")


@pytest.fixture(scope="module")
def references(prompted_dir, default_dir, tmp_path_factory):
    """sentence-transformers' answers: (folder, prompt_name) -> [n, dim]."""
    calls = [{"texts": TEXTS, "prompt_name": name} for name in (None, "query", "passage")]
    work = tmp_path_factory.mktemp("st")
    answers = {}
    for folder, names in ((prompted_dir, (None, "query", "passage")),
                          (default_dir, (None, "document"))):  # fmt: skip
        calls = [{"texts": TEXTS, "prompt_name": name} for name in names]
        for name, answer in zip(names, encode(folder, calls, sparse=False, work=work), strict=True):
            answers[(folder, name)] = answer
    return answers


def _options(folder, **kw) -> WorkerOptions:
    return WorkerOptions(artifact=str(folder), **kw)


async def _vectors(service, **body) -> tuple[torch.Tensor, dict]:
    status, answer = await post(service, "/v1/embeddings", {"input": TEXTS, **body})
    assert status == 200, answer
    rows = sorted(answer["data"], key=lambda row: row["index"])
    return torch.tensor([row["embedding"] for row in rows]), answer["usage"]


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return got.shape == want.shape and float((got - want).abs().max()) <= TOLERANCE


async def test_prompt_name_is_sentence_transformers_encode_with_it(prompted_dir, references):
    async with running(_options(prompted_dir), golden_check_fn=passing_golden) as service:
        assert service.state is WorkerState.READY, service.reason
        plain, plain_usage = await _vectors(service)
        assert _close(plain, references[(prompted_dir, None)])
        for name in ("query", "passage"):
            got, usage = await _vectors(service, prompt_name=name)
            assert _close(got, references[(prompted_dir, name)]), name
            assert not _close(got, plain)
            # The prompt's tokens are the request's tokens too.
            rows = service.model.tokenize([PROMPTS[name] + text for text in TEXTS])
            assert usage["prompt_tokens"] == sum(map(len, rows)) > plain_usage["prompt_tokens"]
        # Jina's task names the folder's prompt of that name...
        by_task, _ = await _vectors(service, task="passage")
        assert torch.equal(by_task, (await _vectors(service, prompt_name="passage"))[0])
        # ...and a task the folder has no prompt for is served as if none were named.
        unknown_task, _ = await _vectors(service, task="text-matching")
        assert torch.equal(unknown_task, plain)
        card = service.card()["prompts"]
        assert card == {"texts": {"document": "", **PROMPTS}, "default_prompt_name": None}
        _, models = await get(service, "/v1/models")
        assert models["data"][0]["prompts"] == card


async def test_default_prompt_name_applies_when_none_is_named(default_dir, references):
    async with running(_options(default_dir), golden_check_fn=passing_golden) as service:
        default, _ = await _vectors(service)
        assert _close(default, references[(default_dir, None)])
        assert torch.equal(default, (await _vectors(service, prompt_name="query"))[0])
        # `document` is known to every model (empty here): naming it embeds the bare text.
        bare, _ = await _vectors(service, prompt_name="document")
        assert _close(bare, references[(default_dir, "document")])
        assert not _close(bare, default)


@pytest.mark.parametrize("mode", ["mean", "cls", "weightedmean", "max", "lasttoken"])
async def test_include_prompt_false_pools_without_the_prompt(tiny_model_dir, tmp_path, mode):
    keys = {"weightedmean": "pooling_mode_weightedmean_tokens", "max": "pooling_mode_max_tokens",
            "cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
            "lasttoken": "pooling_mode_lasttoken"}  # fmt: skip
    changes = {keys[mode]: True, "include_prompt": False}
    folder = _with_prompts(tiny_model_dir, tmp_path / "model", pooling_changes=changes)
    want = encode(folder, [{"texts": TEXTS, "prompt_name": "retrieval.query"}, {"texts": TEXTS}],
                  sparse=False, work=tmp_path)  # fmt: skip
    async with running(_options(folder), golden_check_fn=passing_golden) as service:
        got, _ = await _vectors(service, prompt_name="retrieval.query")
        assert _close(got, want[0]), mode
        assert _close((await _vectors(service))[0], want[1])
        # Each row pooled from its own start, alone as in the batch.
        for index, text in enumerate(TEXTS):
            status, answer = await post(
                service, "/v1/embeddings", {"input": text, "prompt_name": "retrieval.query"}
            )
            assert status == 200
            assert as_float32(answer["data"][0]["embedding"]) == got[index].tolist()


async def test_prompt_refusals_name_the_field(prompted_dir):
    async with running(_options(prompted_dir), golden_check_fn=passing_golden) as service:
        status, answer = await post(
            service, "/v1/embeddings", {"input": "hi", "prompt_name": "queyr"}
        )
        assert status == 400
        message = answer["error"]["message"]
        assert message.startswith("prompt_name: unknown prompt 'queyr'")
        assert "document, passage, query, retrieval.query" in message
        for body, start in (
            ({"input": "hi", "prompt_name": 3}, "prompt_name: expected a string"),
            ({"input": "hi", "task": ["x"]}, "task: expected a string"),
            ({"input": "hi", "task": "query", "prompt_name": "query"}, "task: give prompt_name"),
            ({"input": [7592, 2088], "prompt_name": "query"}, "prompt_name: applies to text"),
        ):
            status, answer = await post(service, "/v1/embeddings", body)
            assert status == 400, body
            assert answer["error"]["message"].startswith(start), answer


async def test_the_prompt_counts_against_the_input_limit(prompted_dir):
    # "hello world" is 4 tokens; with "Represent the query: " before it, 8.
    options = _options(prompted_dir, max_tokens=6)
    async with running(options, golden_check_fn=passing_golden) as service:
        status, _ = await post(service, "/v1/embeddings", {"input": "hello world"})
        assert status == 200
        body = {"input": ["hello world"], "prompt_name": "retrieval.query"}
        status, answer = await post(service, "/v1/embeddings", {**body, "truncate": False})
        assert status == 400
        assert answer["error"]["message"].startswith("input[0]: 8 tokens exceed")
        status, answer = await post(service, "/v1/embeddings", {**body, "truncate": True})
        assert status == 200
        assert answer["usage"]["prompt_tokens"] == 6
        assert answer["usage"]["truncated_inputs"] == ["input[0]"]


async def test_token_embeddings_are_the_prompted_rows_hidden_states(prompted_dir):
    async with running(_options(prompted_dir), golden_check_fn=passing_golden) as service:
        body = {"input": ["hello world"], "prompt_name": "query"}
        status, answer = await post(service, "/v1/token_embeddings", body)
        assert status == 200, answer
        row = service.model.tokenize([PROMPTS["query"] + "hello world"])[0]
        assert answer["usage"]["prompt_tokens"] == len(row)
        expected = service.model.token_states([row]).tolist()
        got = answer["data"][0]["embeddings"]
        assert len(got) == len(row)
        for token, want in zip(got, expected, strict=True):
            assert token == pytest.approx(want, abs=TOLERANCE)
        status, answer = await post(
            service, "/v1/token_embeddings", {"input": "hi", "prompt_name": "queyr"}
        )
        assert status == 400 and answer["error"]["param"] == "prompt_name", answer
