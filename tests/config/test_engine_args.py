"""EngineArgs: the deployment -> worker arguments are mapped once, argv out and back in."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sr.config.engine import DEPLOYMENT_DTYPES, KERNELS, OVERFLOW_MODES, PROFILES, EngineArgs
from sr.config.schema import Deployment, InputLimits
from sr.errors import UsageError
from sr.pool.replica import worker_argv
from sr.worker.cli import parse_command
from sr.worker.options import WorkerOptions

optional_positive = st.one_of(st.none(), st.integers(1, 10**6))
engines = st.builds(
    EngineArgs,
    artifact=st.from_regex(r"[a-z]+/[A-Za-z0-9.-]{1,12}", fullmatch=True),
    revision=st.one_of(st.none(), st.from_regex(r"[0-9a-f]{7,40}", fullmatch=True)),
    profile=st.sampled_from(PROFILES),
    max_tokens=st.integers(2, 10**5),
    overflow=st.sampled_from(OVERFLOW_MODES),
    max_num_seqs=optional_positive,
    max_num_batched_tokens=optional_positive,
    dtype=st.sampled_from(DEPLOYMENT_DTYPES),
    kernel=st.sampled_from(KERNELS),
).filter(lambda e: e.max_num_batched_tokens is None or e.max_num_batched_tokens >= e.max_tokens)


def _worker_args(argv: list[str]) -> list[str]:
    return argv[argv.index("worker") + 1 :]


@settings(max_examples=80, deadline=None)
@given(engines, st.integers(1, 64))
def test_the_worker_parses_back_exactly_the_engine_args_the_pool_wrote(engine, threads):
    argv = ["worker", *engine.argv(), "--device", "cuda:3", "--threads", str(threads)]
    command = parse_command([*_worker_args(argv), "--uds", "/run/w.sock"])
    assert command.options.engine_args == engine
    assert command.options == WorkerOptions.serving(engine, device="cuda:3", threads=threads)


def test_a_deployments_engine_args_travel_through_worker_argv():
    dep = Deployment(
        artifact="org/m",
        revision="abc1234",
        profile="throughput",
        input=InputLimits(max_tokens=64, overflow="truncate"),
        max_num_seqs=8,
        max_num_batched_tokens=512,
        dtype="bfloat16",
        kernel="blas",
    )
    argv = worker_argv(dep, "cpu", 3, "/run/w.sock")
    options = parse_command(_worker_args(argv)).options
    assert options.engine_args == dep.engine_args()
    assert (options.device, options.threads) == ("cpu", 3)


def test_defaults_marked_omit_if_default_stay_out_of_the_argv():
    argv = EngineArgs(artifact="org/m").argv()
    # max_tokens unset: the worker takes its folder's own limit (sr.models.limits)
    assert " ".join(argv) == "--artifact org/m --profile exact --overflow reject"
    assert "--max-tokens 384" in " ".join(EngineArgs(artifact="org/m", max_tokens=384).argv())
    fields = {f.name for f in attrs.fields(EngineArgs) if f.metadata.get("omit_if_default")}
    assert fields == {"dtype", "kernel", "engine"}


@pytest.mark.parametrize("device", ["cuda:01", "cuda:12345", "gpu:0", "cuda"])
def test_the_worker_refuses_the_devices_the_config_refuses(device):
    # One device rule (sr.config.validate.device_error) for the config and the worker.
    with pytest.raises(UsageError, match=r"^--device: invalid device"):
        WorkerOptions(artifact="org/m", device=device).validate()
