"""`kernel` on a deployment and `sr worker --kernel`: the linear products' kernel, chosen by
the host's probe (`auto`) or pinned (`blas` keeps the weights as the file's shared pages);
validated with its path or flag, passed to managed workers, reported on the card and held
against an attached worker's card."""

from __future__ import annotations

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

TEXTS = ["a kernel pinned by the config", "and one the host picks"]


def _text(kernel_line: str) -> str:
    return (
        "global:\n  model_catalog:\n    deployments:\n      primary:\n"
        f"        artifact: /models/mini\n{kernel_line}        device: cpu\n"
    )


def test_auto_is_the_default_left_out_of_the_dump_and_blas_round_trips():
    default = parse_config(_text(""))
    assert default.deployments["primary"].kernel == "auto"
    assert "kernel" not in dump_config(default)
    pinned = parse_config(_text("        kernel: blas\n"))
    assert pinned.deployments["primary"].kernel == "blas"
    text = dump_config(pinned)
    assert "    kernel: blas\n" in text and parse_config(text) == pinned


def test_an_unknown_kernel_is_an_error_naming_the_field():
    with pytest.raises(ConfigError) as info:
        parse_config(_text("        kernel: mkl\n"))
    (issue,) = [str(i) for i in info.value.issues]
    assert "global.model_catalog.deployments.primary.kernel" in issue and "'mkl'" in issue


def test_the_kernel_reaches_the_argv_and_the_identity_only_when_pinned():
    auto = Deployment(artifact="/m", replicas=[Replica(device="cpu")])
    blas = Deployment(artifact="/m", kernel="blas", replicas=[Replica(device="cpu")])
    assert "--kernel" not in worker_argv(auto, "cpu", 1, "/run/x.sock")
    argv = worker_argv(blas, "cpu", 1, "/run/x.sock")
    assert argv[argv.index("--kernel") + 1] == "blas"
    options, _ = parse_args(argv[argv.index("worker") + 1 :])
    assert options.kernel == "blas"
    # a pinned kernel is another worker: a reload that pins it restarts the replica
    assert replica_identities("p", auto, 1) != replica_identities("p", blas, 1)


def test_a_worker_serving_another_kernel_than_pinned_is_incompatible():
    blas = Deployment(artifact="/m", kernel="blas", replicas=[Replica(device="cpu")])
    card = {"artifact": "/m", "kernel": {"linear": "onednn", "reason": "probed"}}
    assert "kernel" in incompatibility(blas, card)
    assert incompatibility(blas, {**card, "kernel": {"linear": "blas"}}) is None
    auto = Deployment(artifact="/m", replicas=[Replica(device="cpu")])
    assert incompatibility(auto, card) is None


def test_a_bad_kernel_flag_is_a_usage_error_naming_it():
    with pytest.raises(UsageError, match="--kernel"):
        WorkerOptions(artifact="/m", kernel="mkl").validate()


async def test_a_pinned_blas_worker_reports_it_and_answers_like_the_probed_one(tiny_model_dir):
    answers, cards = {}, {}
    for kernel in ("auto", "blas"):
        async with running(WorkerOptions(artifact=str(tiny_model_dir), kernel=kernel)) as svc:
            assert svc.state is WorkerState.READY, svc.reason
            status, body = await post(svc, "/v1/embeddings", {"input": TEXTS})
            cards[kernel] = (await get(svc, "/v1/models"))[1]["data"][0]["kernel"]
        assert status == 200, body
        answers[kernel] = torch.tensor([item["embedding"] for item in body["data"]])
    assert cards["blas"] == {"linear": "blas", "reason": "F.linear, as asked"}
    assert cards["auto"]["linear"] in ("blas", "onednn") and cards["auto"]["reason"]
    # another kernel may round differently, never by more than the golden check's bound
    assert (answers["auto"] - answers["blas"]).abs().max().item() <= 1e-5
