"""Prompts and sparse embeddings through a real `sr serve` serving two deployments (a
prompted embedder and a SPLADE sparse encoder), each call as its client makes it: the
openai SDK's `extra_body` prompt_name (and Jina's `task`), TEI's /embed with prompt_name,
TEI's /embed_sparse and the native /v1/sparse_embeddings; sentence-transformers' encode on
the same tiny random folders is the reference."""

from __future__ import annotations

import json
import shutil

import openai
import pytest
import torch

from tests.models.st_reference import encode, save_sparse_encoder
from tests.models.test_sparse_encoder import write_mlm
from tests.serve_process import INVENTORY_PATH, ServeProcess, serve_config

pytestmark = pytest.mark.e2e

TOLERANCE = 1e-5
TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog."]
PROMPTS = {"query": "query: ", "passage": "passage: "}


@pytest.fixture(scope="module")
def folders(tiny_model_dir, tmp_path_factory):
    embedder = tmp_path_factory.mktemp("prompted") / "model"
    shutil.copytree(tiny_model_dir, embedder)
    config = {"prompts": PROMPTS, "default_prompt_name": "passage"}
    (embedder / "config_sentence_transformers.json").write_text(json.dumps(config))
    mlm = write_mlm(tmp_path_factory.mktemp("mlm"), "bert", seed=5)
    splade = save_sparse_encoder(
        mlm, tmp_path_factory.mktemp("splade") / "model", pooling="max", activation="relu",
        prompts={"query": "query: "}, max_active_dims=40,
    )  # fmt: skip
    return embedder, splade


@pytest.fixture(scope="module")
def references(folders, tmp_path_factory):
    embedder, splade = folders
    work = tmp_path_factory.mktemp("st")
    dense = encode(
        embedder, [{"texts": TEXTS}, {"texts": TEXTS, "prompt_name": "query"}],
        sparse=False, work=work,
    )  # fmt: skip
    sparse = encode(
        splade, [{"texts": TEXTS}, {"texts": TEXTS, "prompt_name": "query"}],
        sparse=True, work=work,
    )  # fmt: skip
    return {"default": dense[0], "query": dense[1], "sparse": sparse[0], "sparse query": sparse[1]}


@pytest.fixture(scope="module")
def server(tmp_path_factory, folders):
    embedder, splade = folders
    config = serve_config(embedder, 1)
    deployments = config["global"]["model_catalog"]["deployments"]
    deployments["splade"] = {"artifact": str(splade), "replicas": [{"device": "cpu"}]}
    process = ServeProcess(tmp_path_factory.mktemp("prompts-e2e"), config)
    process.start(timeout_s=90)
    yield process
    process.stop()


def _close(got, want) -> bool:
    got = torch.tensor(got)
    return got.shape == want.shape and float((got - want).abs().max()) <= TOLERANCE


def test_openai_sdk_extra_body_prompt_name(server, references):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as client:

        def vectors(**options):
            answer = client.embeddings.create(
                model="primary", input=TEXTS, encoding_format="float", **options
            )
            return [d.embedding for d in answer.data], answer.usage

        default, default_usage = vectors()
        assert _close(default, references["default"])  # default_prompt_name: passage
        query, usage = vectors(extra_body={"prompt_name": "query"})
        assert _close(query, references["query"])
        assert usage.prompt_tokens == default_usage.prompt_tokens  # "query: " is as long
        assert vectors(extra_body={"task": "query"})[0] == query  # Jina's task
        with pytest.raises(openai.BadRequestError) as caught:
            vectors(extra_body={"prompt_name": "retrieval.query"})
        assert caught.value.param == "prompt_name"
        assert "document, passage, query" in caught.value.message


def test_tei_embed_prompt_name(server, references):
    answer = server.client.post(
        "/embed", json={"inputs": TEXTS, "prompt_name": "query", "model": "primary"}
    )
    assert answer.status_code == 200, answer.text
    assert _close(answer.json(), references["query"])
    info = server.client.get("/info", params={"model": "primary"}).json()
    assert info["prompts"] == {"document": "", **PROMPTS}
    assert info["default_prompt_name"] == "passage"
    (entry,) = [m for m in server.client.get("/v1/models").json()["data"] if m["id"] == "primary"]
    assert entry["prompts"]["default_prompt_name"] == "passage"
    inventory = server.client.get(INVENTORY_PATH).json()["deployments"]
    assert inventory["primary"]["prompts"]["texts"]["query"] == "query: "


def _dense(rows: list[list[tuple[int, float]]]) -> torch.Tensor:
    out = torch.zeros(len(rows), 30522)
    for i, row in enumerate(rows):
        for index, value in row:
            out[i, index] = value
    return out


def test_tei_embed_sparse_and_the_native_route(server, references):
    for body, want in (({}, references["sparse"]), ({"prompt_name": "query"},
                                                     references["sparse query"])):  # fmt: skip
        answer = server.client.post(
            "/embed_sparse", json={"inputs": TEXTS, "model": "splade", **body}
        )
        assert answer.status_code == 200, answer.text
        tei = [[(e["index"], e["value"]) for e in row] for row in answer.json()]
        assert all(len(row) == 40 for row in tei)  # max_active_dims
        assert float((_dense(tei) - want).abs().max()) <= TOLERANCE
        native = server.client.post(
            "/v1/sparse_embeddings", json={"input": TEXTS, "model": "splade", **body}
        )
        assert native.status_code == 200, native.text
        rows = [list(zip(d["indices"], d["values"], strict=True)) for d in native.json()["data"]]
        assert rows == tei
    info = server.client.get("/info", params={"model": "splade"}).json()
    assert info["model_type"] == {"embedding": {"pooling": "splade"}}
    refused = server.client.post("/embed", json={"inputs": "hi", "model": "splade"})
    assert refused.status_code == 422
    assert "/embed_sparse" in refused.json()["error"]
