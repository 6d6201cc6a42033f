"""`engine` on a deployment and `sr worker --engine`: torch (the default, left out of the
dump, the argv and the identity) or onnxruntime (sr.models.onnx_engine); validated with its
path or flag, refused in one line naming the extra where onnxruntime is not installed,
served float32 on the CPU, reported on the card and held against an attached worker's card."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from worker_fakes import get, post, running

from sr.config.load import dump_config, parse_config
from sr.config.schema import Deployment, Replica
from sr.errors import ConfigError, UsageError
from sr.pool.identity import replica_identities
from sr.pool.replica import incompatibility, worker_argv
from sr.worker.cli import parse_args
from sr.worker.options import WorkerOptions
from sr.worker.state import WorkerState

TEXTS = ["one engine or the other", "answers the same", "x"]
ENGINE_PATH = "global.model_catalog.deployments.primary.engine"


def _text(extra: str) -> str:
    return (
        "global:\n  model_catalog:\n    deployments:\n      primary:\n"
        f"        artifact: /models/mini\n{extra}        device: cpu\n"
    )


@pytest.fixture
def without_onnxruntime(monkeypatch):
    real = importlib.util.find_spec

    def find_spec(name, *args):
        return None if name == "onnxruntime" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_torch_is_the_default_left_out_of_the_dump_and_onnxruntime_round_trips():
    default = parse_config(_text(""))
    assert default.deployments["primary"].engine == "torch"
    assert "engine" not in dump_config(default)
    chosen = parse_config(_text("        engine: onnxruntime\n"))
    text = dump_config(chosen)
    assert "    engine: onnxruntime\n" in text and parse_config(text) == chosen


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ("        engine: tensorrt\n", "unknown engine 'tensorrt'"),
        ("        engine: onnxruntime\n        dtype: bfloat16\n", "float32 only"),
        ("        engine: onnxruntime\n        kernel: onednn\n", "kernel blas"),
    ],
)
def test_an_engine_it_cannot_serve_is_an_error_naming_the_field(extra, words):
    with pytest.raises(ConfigError) as info:
        parse_config(_text(extra))
    (issue,) = [str(i) for i in info.value.issues]
    assert ENGINE_PATH in issue and words in issue


def test_without_onnxruntime_the_config_names_the_extra(without_onnxruntime):
    with pytest.raises(ConfigError) as info:
        parse_config(_text("        engine: onnxruntime\n"))
    (issue,) = [str(i) for i in info.value.issues]
    assert ENGINE_PATH in issue and "pip install 'sr[onnx]'" in issue


def test_the_worker_flag_is_validated_in_the_workers_words(without_onnxruntime):
    with pytest.raises(UsageError, match="--engine: must be one of torch, onnxruntime"):
        WorkerOptions(artifact="/m", engine="tensorrt").validate()
    with pytest.raises(UsageError, match=r"--engine: .*sr\[onnx\]"):
        WorkerOptions(artifact="/m", engine="onnxruntime").validate()


def test_the_engine_reaches_the_argv_and_the_identity_only_when_chosen():
    torch_dep = Deployment(artifact="/m", replicas=[Replica(device="cpu")])
    ort_dep = Deployment(artifact="/m", engine="onnxruntime", replicas=[Replica(device="cpu")])
    assert "--engine" not in worker_argv(torch_dep, "cpu", 1, "/run/x.sock")
    argv = worker_argv(ort_dep, "cpu", 1, "/run/x.sock")
    assert argv[argv.index("--engine") + 1] == "onnxruntime"
    options, _ = parse_args(argv[argv.index("worker") + 1 :])
    assert options.engine == "onnxruntime"
    # another engine is another worker: a reload that changes it restarts the replica
    assert replica_identities("p", torch_dep, 1) != replica_identities("p", ort_dep, 1)


def test_an_attached_worker_running_another_engine_is_incompatible():
    ort_dep = Deployment(artifact="/m", engine="onnxruntime", replicas=[Replica(device="cpu")])
    card = {"artifact": "/m", "engine": {"name": "torch"}}
    assert "engine" in incompatibility(ort_dep, card)
    assert incompatibility(ort_dep, {**card, "engine": {"name": "onnxruntime"}}) is None
    assert incompatibility(ort_dep, {"artifact": "/m"}) is None  # a card without engines


async def test_an_onnxruntime_worker_answers_as_a_torch_worker_and_says_so(tiny_model_dir):
    answers, cards = {}, {}
    # throughput for onnxruntime: it serves float32 where the torch engine may pick bfloat16
    for engine, profile in (("torch", "exact"), ("onnxruntime", "throughput")):
        options = WorkerOptions(artifact=str(tiny_model_dir), engine=engine, profile=profile)
        async with running(options) as svc:
            assert svc.state is WorkerState.READY, svc.reason
            status, body = await post(svc, "/v1/embeddings", {"input": TEXTS})
            cards[engine] = (await get(svc, "/v1/models"))[1]["data"][0]
        assert status == 200, body
        answers[engine] = torch.tensor([item["embedding"] for item in body["data"]])
    assert (answers["onnxruntime"] - answers["torch"]).abs().max().item() <= 1e-5
    assert cards["torch"]["engine"]["name"] == "torch"
    card = cards["onnxruntime"]
    assert card["engine"]["name"] == "onnxruntime" and card["engine"]["threads"] == 1
    assert card["dtype"] == "float32" and "onnxruntime" in card["precision"]["reason"]
    assert card["golden"]["status"] == "passed" and card["batching"]["exact_batching"] is True
