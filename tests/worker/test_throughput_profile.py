"""`sr worker --profile throughput --dtype auto` serves the precision of sr.config.precision's
rule on its host (bfloat16 on CPUs with native bfloat16, here injected for fakes and read
from /proc/cpuinfo for real workers), says which and why in the card and the start log, and
reports the golden set's deviation from float32 (max abs diff, least cosine)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from worker_fakes import FakeModel, get, passing_golden, running

from sr.config.precision import BF16_CPU_FLAGS, cpu_flags
from sr.config.schema import DEFAULT_DTYPE
from sr.errors import UsageError
from sr.events import RecordingSink
from sr.models import EMBEDDED_DEFAULT
from sr.worker import cli
from sr.worker.options import WorkerOptions
from sr.worker.state import WorkerState

NATIVE_BF16 = frozenset({"avx512f", "avx512_bf16"})
NO_BF16 = frozenset({"avx512f", "avx2"})
WORKER = [sys.executable, "-m", "sr", "worker"]
THROUGHPUT_AUTO = ["--profile", "throughput", "--dtype", "auto"]
HOST_HAS_BF16 = any(flag in cpu_flags() for flag in BF16_CPU_FLAGS)


def test_cli_takes_the_profile_and_leaves_the_dtype_to_it():
    args = ["--artifact", "a", "--port", "0", "--profile", "throughput"]
    options, _ = cli.parse_args([*args, "--dtype", "auto"])
    assert (options.profile, options.dtype) == ("throughput", "auto")
    # without --dtype: the deployment default, which the pool leaves out of the argv
    assert cli.parse_args(args)[0].dtype == DEFAULT_DTYPE
    with pytest.raises(UsageError) as info:
        cli.parse_args(["--artifact", "a", "--port", "0", "--profile", "fast"])
    assert str(info.value).startswith("--profile: unknown profile 'fast'")
    with pytest.raises(UsageError) as info:
        cli.parse_args(["--artifact", "a", "--port", "0", "--dtype", "bf16"])
    assert str(info.value) == (
        "--dtype: must be one of auto, float32, bfloat16, float16, got 'bf16'"
    )


def _loader(model: FakeModel, seen: list[str]):
    def load(options: WorkerOptions) -> FakeModel:
        seen.append(options.dtype)  # the dtype the model is loaded in
        return model

    return load


@pytest.mark.parametrize(
    ("profile", "dtype", "flags", "served", "because"),
    [
        ("throughput", "auto", NATIVE_BF16, "bfloat16", "native bfloat16 (avx512_bf16)"),
        ("throughput", "auto", NO_BF16, "float32", "no native bfloat16"),
        ("throughput", "float32", NATIVE_BF16, "float32", "dtype float32 was asked for"),
        ("exact", "auto", NATIVE_BF16, "float32", "profile exact serves float32"),
        ("exact", "bfloat16", NO_BF16, "bfloat16", "dtype bfloat16 was asked for"),
    ],
)
async def test_the_card_and_start_log_say_which_dtype_is_served_and_why(
    profile, dtype, flags, served, because
):
    events, seen = RecordingSink(), []
    opts = WorkerOptions(artifact="fake", profile=profile, dtype=dtype)
    kwargs = {
        "load_model_fn": _loader(FakeModel(), seen),
        "golden_check_fn": passing_golden,
        "host_cpu_flags": flags,
    }
    async with running(opts, events=events, **kwargs) as svc:
        assert svc.state is WorkerState.READY, svc.reason
        card = (await get(svc, "/v1/models"))[1]["data"][0]
    assert seen == [served]
    assert card["dtype"] == served
    assert card["precision"]["dtype"] == served and card["precision"]["requested"] == dtype
    assert because in card["precision"]["reason"]
    (line,) = events.named("worker_batching")
    assert line["dtype"] == served and because in line["dtype_reason"]
    # throughput shares forwards whatever the probe says; exact only when it passes
    assert card["batching"]["cross_request"] is True


async def test_a_real_throughput_worker_reports_its_golden_deviation_from_float32():
    """The embedded MiniLM under --profile throughput --dtype auto on this host: bfloat16
    where the CPU has it (this host: AVX512_BF16), with the golden set's deviation from the
    recorded float32 references inside the bfloat16 bound: max abs 1e-2, cosine at least
    0.999, the throughput profile's floor."""
    opts = WorkerOptions(artifact=EMBEDDED_DEFAULT, profile="throughput", dtype="auto")
    async with running(opts) as svc:
        assert svc.state is WorkerState.READY, svc.reason
        card = svc.card()
    golden = card["golden"]
    assert golden["status"] == "passed"
    assert golden["against"] == "golden_minilm.json"
    if not HOST_HAS_BF16:
        assert card["dtype"] == "float32" and "no native bfloat16" in card["precision"]["reason"]
        assert golden["max_abs_diff"] <= 1e-5
        return
    assert card["dtype"] == "bfloat16" and card["precision"]["requested"] == "auto"
    assert svc.model.dtype.is_floating_point and str(svc.model.dtype) == "torch.bfloat16"
    assert 0 < golden["max_abs_diff"] <= 1e-2
    assert 0.999 <= golden["min_cosine"] < 1.0
    assert "at bfloat16" in golden["reason"]


@pytest.mark.e2e
def test_sr_worker_profile_throughput_process_serves_bfloat16_on_this_host():
    proc = subprocess.Popen(
        [*WORKER, "--artifact", EMBEDDED_DEFAULT, "--port", "0", *THROUGHPUT_AUTO],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        text=True,
    )
    try:
        port = json.loads(proc.stdout.readline())["port"]
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            for _ in range(300):
                if client.get("/health").status_code == 200:
                    break
                assert proc.poll() is None
                time.sleep(0.1)
            card = client.get("/v1/models").json()["data"][0]
            vector = client.post("/v1/embeddings", json={"input": "hello"}).json()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    assert card["state"] == "ready" and card["profile"] == "throughput"
    assert card["dtype"] == ("bfloat16" if HOST_HAS_BF16 else "float32")
    assert card["golden"]["status"] == "passed" and card["golden"]["min_cosine"] >= 0.999
    assert len(vector["data"][0]["embedding"]) == 384
