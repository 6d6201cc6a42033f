"""OpenAI's /v1/embeddings fields on the worker, in process: `dimensions`, token-id input,
`user`, and errors with OpenAI's `type` and `param`."""

from __future__ import annotations

import base64
import json
import math
import shutil
import struct

import pytest
from worker_fakes import passing_golden, post, running

from sr.worker.options import WorkerOptions
from sr.worker.state import WorkerState

HELLO_WORLD_IDS = [7592, 2088]  # "hello world" without [CLS]/[SEP] (MiniLM vocabulary)
VOCAB = 30522


def options(model_dir, **kw) -> WorkerOptions:
    return WorkerOptions(artifact=str(model_dir), **kw)


@pytest.fixture(scope="session")
def unnormalized_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny BERT without its Normalize module."""
    folder = tmp_path_factory.mktemp("tiny-bert-raw") / "model"
    shutil.copytree(tiny_model_dir, folder)
    modules = json.loads((folder / "modules.json").read_text())
    kept = [m for m in modules if not m["type"].endswith("Normalize")]
    (folder / "modules.json").write_text(json.dumps(kept))
    shutil.rmtree(folder / "2_Normalize", ignore_errors=True)
    return folder


def _norm(vector):
    return math.sqrt(math.fsum(x * x for x in vector))


async def _embed(service, **body):
    status, answer = await post(service, "/v1/embeddings", body)
    assert status == 200, answer
    return answer


async def test_dimensions_cut_and_renormalise(worker):
    size = worker.model.embedding_dim
    full = (await _embed(worker, input="hello world"))["data"][0]["embedding"]
    cut = (await _embed(worker, input="hello world", dimensions=8))["data"][0]["embedding"]
    assert len(cut) == 8
    assert math.isclose(_norm(cut), 1.0, rel_tol=1e-6)
    head = full[:8]
    assert cut == pytest.approx([x / _norm(head) for x in head], rel=1e-6)
    same = await _embed(worker, input="hello world", dimensions=size)
    assert same["data"][0]["embedding"] == full
    b64 = await _embed(worker, input="hello world", dimensions=8, encoding_format="base64")
    raw = base64.b64decode(b64["data"][0]["embedding"])
    assert list(struct.unpack("<8f", raw)) == pytest.approx(cut, rel=1e-6)


async def test_dimensions_without_normalize_only_cut(unnormalized_model_dir):
    opts = options(unnormalized_model_dir)
    async with running(opts, golden_check_fn=passing_golden) as service:
        assert service.state is WorkerState.READY, service.reason
        assert service.model.normalize is False
        full = (await _embed(service, input="hello world"))["data"][0]["embedding"]
        cut = (await _embed(service, input="hello world", dimensions=5))["data"][0]["embedding"]
    assert cut == full[:5]


@pytest.mark.parametrize("value", [0, -1, 1.5, "8", True, None, [8], 10_000])
async def test_bad_dimensions_are_400_naming_dimensions(worker, value):
    status, answer = await post(worker, "/v1/embeddings", {"input": "x", "dimensions": value})
    assert status == 400, answer
    error = answer["error"]
    assert error["code"] == "invalid_request" and error["message"].startswith("dimensions: ")
    assert error["param"] == "dimensions" and error["type"] == "invalid_request_error"


async def test_dimensions_above_the_size_names_the_size(worker):
    size = worker.model.embedding_dim
    _, answer = await post(worker, "/v1/embeddings", {"input": "x", "dimensions": size + 1})
    assert f"embedding size {size}" in answer["error"]["message"]


async def test_token_ids_embed_as_the_text(worker):
    text = await _embed(worker, input=["hello world", "hello"])
    one = await _embed(worker, input=HELLO_WORLD_IDS)
    several = await _embed(worker, input=[HELLO_WORLD_IDS, [7592]])
    assert one["data"][0]["embedding"] == text["data"][0]["embedding"]
    assert [d["embedding"] for d in several["data"]] == [d["embedding"] for d in text["data"]]
    assert [d["index"] for d in several["data"]] == [0, 1]
    # [CLS] and [SEP] are counted as for text
    assert one["usage"]["prompt_tokens"] == len(HELLO_WORLD_IDS) + 2
    assert several["usage"] == text["usage"]
    cut = await _embed(worker, input=[HELLO_WORLD_IDS], dimensions=4)
    assert len(cut["data"][0]["embedding"]) == 4


@pytest.mark.parametrize(
    ("value", "param"),
    [
        ([7592, VOCAB], "input[1]"),
        ([-1], "input[0]"),
        ([7592, "world"], "input[1]"),
        ([7592, True], "input[1]"),
        ([7592, 1.0], "input[1]"),
        ([[7592], [2088, VOCAB + 5]], "input[1][1]"),
        ([[7592], []], "input[1]"),
        ([[]], "input[0]"),
        ([[7592], 2088], "input[1]"),
        ([[7592], [None]], "input[1][0]"),
        ([], "input"),
    ],
)
async def test_bad_token_ids_are_400_naming_the_position(worker, value, param):
    status, answer = await post(worker, "/v1/embeddings", {"input": value})
    assert status == 400, answer
    error = answer["error"]
    assert error["code"] == "invalid_request"
    assert error["message"].startswith(f"{param}: "), error["message"]
    assert error["param"] == param


async def test_token_ids_follow_the_overflow_rule(tiny_model_dir):
    ids = [7592] * 10  # 12 tokens with [CLS] and [SEP]
    async with running(options(tiny_model_dir, max_tokens=8), golden_check_fn=passing_golden) as s:
        status, answer = await post(s, "/v1/embeddings", {"input": [[7592], ids]})
    assert status == 400
    assert answer["error"]["message"].startswith("input[1]: 12 tokens exceed input.max_tokens 8")
    assert answer["error"]["param"] == "input[1]"
    opts = options(tiny_model_dir, max_tokens=8, overflow="truncate")
    async with running(opts, golden_check_fn=passing_golden) as s:
        cut = await _embed(s, input=[[7592], ids])
        short = await _embed(s, input=[7592] * 6)  # exactly [CLS] + 6 + [SEP]
    assert cut["usage"]["truncated_inputs"] == ["input[1]"]
    assert cut["usage"]["prompt_tokens"] == 3 + 8
    assert cut["data"][1]["embedding"] == short["data"][0]["embedding"]


async def test_every_openai_field_is_accepted(worker):
    answer = await _embed(
        worker,
        input="hello",
        model=worker.options.artifact,
        encoding_format="float",
        dimensions=16,
        user="user-1234",
    )
    assert len(answer["data"][0]["embedding"]) == 16
    status, answer = await post(worker, "/v1/embeddings", {"input": "x", "user": 5})
    assert status == 400 and answer["error"]["param"] == "user"


async def test_error_bodies_have_openai_type_and_param(worker):
    status, answer = await post(worker, "/v1/embeddings", {"input": ["ok", "  "]})
    assert status == 400
    assert answer["error"] == {
        "code": "invalid_request",
        "message": answer["error"]["message"],
        "type": "invalid_request_error",
        "param": "input[1]",
    }
    _, answer = await post(worker, "/v1/embeddings", b"{not json")
    assert answer["error"]["param"] is None
    status, answer = await post(worker, "/v1/embeddings", {"input": "x", "model": "other"})
    assert status == 404
    assert answer["error"]["param"] == "model"
    assert answer["error"]["type"] == "invalid_request_error"
