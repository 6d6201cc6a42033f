"""`sr worker --dtype`: validated with one line naming the flag, float16 refused on cpu,
the card and one log line report the dtype and whether exact batching holds at it, and a
worker serving a real model at bfloat16 answers /v1/embeddings close to float32."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from worker_fakes import FakeModel, fake_service_kwargs, get, post, running

from sr.errors import UsageError
from sr.events import RecordingSink
from sr.models import EMBEDDED_DEFAULT
from sr.worker import cli
from sr.worker.options import WorkerOptions
from sr.worker.state import WorkerState

TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog", "a"]


def test_dtype_defaults_to_auto_and_takes_the_reduced_precisions():
    # auto: the profile decides on the host, float32 under exact (sr.config.precision)
    options, _ = cli.parse_args(["--artifact", "a", "--port", "0"])
    assert options.dtype == "auto"
    options, _ = cli.parse_args(["--artifact", "a", "--port", "0", "--dtype", "bfloat16"])
    assert options.dtype == "bfloat16"
    WorkerOptions(artifact="a", device="cuda:0", dtype="float16").validate()


@pytest.mark.parametrize(
    ("device", "dtype", "message"),
    [
        ("cpu", "fp8", "--dtype: must be one of auto, float32, bfloat16, float16, got 'fp8'"),
        ("cpu", "Float32", "--dtype: must be one of auto, float32, bfloat16, float16, got"),
        ("cpu", "float16", "--dtype: float16 is not served on cpu"),
    ],
)
def test_bad_dtypes_are_usage_errors_naming_the_flag(device, dtype, message):
    with pytest.raises(UsageError) as info:
        WorkerOptions(artifact="a", device=device, dtype=dtype).validate()
    assert str(info.value).startswith(message)


def test_float16_on_cpu_stops_the_worker_at_startup_with_one_line(capsys):
    assert cli.main(["--artifact", "a", "--port", "0", "--dtype", "float16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("sr worker: --dtype: float16 is not served on cpu")
    assert "use bfloat16 or float32" in err


async def test_card_and_one_log_line_report_dtype_and_exact_batching():
    events = RecordingSink()
    opts = WorkerOptions(artifact="fake", dtype="bfloat16")
    async with running(opts, events=events, **fake_service_kwargs(FakeModel())) as svc:
        card = (await get(svc, "/v1/models"))[1]["data"][0]
    assert card["dtype"] == "bfloat16"
    assert card["batching"]["exact_batching"] is True
    assert card["batching"]["cross_request"] is True
    (line,) = events.named("worker_batching")
    assert line["dtype"] == "bfloat16" and line["exact_batching"] is True
    assert line["cross_request"] is True and line["profile"] == "exact"

    # Rows that differ alone and batched at the dtype served: exact serves one request per
    # forward, and says so once.
    events = RecordingSink()
    kwargs = fake_service_kwargs(FakeModel(invariant=False))
    async with running(opts, events=events, **kwargs) as svc:
        card = svc.card()
    assert card["batching"]["exact_batching"] is False
    assert card["batching"]["cross_request"] is False
    (line,) = events.named("worker_batching")
    assert (line["exact_batching"], line["cross_request"]) == (False, False)
    assert "differs" in line["detail"]


async def test_a_worker_serving_bfloat16_answers_embeddings_close_to_float32(tiny_model_dir):
    answers = {}
    for dtype in ("float32", "bfloat16"):
        opts = WorkerOptions(artifact=str(tiny_model_dir), dtype=dtype)
        async with running(opts) as svc:
            assert svc.state is WorkerState.READY, svc.reason
            status, body = await post(svc, "/v1/embeddings", {"input": TEXTS})
            card = (await get(svc, "/v1/models"))[1]["data"][0]
        assert status == 200, body
        assert card["dtype"] == dtype and card["golden"]["status"] == "passed"
        assert svc.model.dtype == getattr(torch, dtype)
        if dtype == "bfloat16":
            assert card["batching"]["probe"]["detail"].endswith("at bfloat16")
        answers[dtype] = torch.tensor([item["embedding"] for item in body["data"]])
    want, got = answers["float32"], answers["bfloat16"]
    assert not torch.equal(got, want)
    # the bound of tests/models/test_model_dtype.py (measured 3.1e-3, cosine 0.99998)
    assert (got - want).abs().max().item() <= 1.5e-2
    assert F.cosine_similarity(got, want).min().item() >= 0.999


async def test_the_embedded_minilm_passes_its_golden_check_served_at_bfloat16():
    opts = WorkerOptions(artifact=EMBEDDED_DEFAULT, dtype="bfloat16")
    async with running(opts) as svc:
        assert svc.state is WorkerState.READY, svc.reason
        status, body = await post(svc, "/v1/embeddings", {"input": "hello"})
        card = svc.card()
    assert status == 200 and len(body["data"][0]["embedding"]) == 384
    golden = card["golden"]
    assert golden["status"] == "passed"
    assert "golden_minilm.json at bfloat16" in golden["reason"]
    assert 0 < golden["max_abs_diff"] <= 1e-2
