"""The rule of `dtype: auto` (sr.config.precision): an explicit dtype always wins; exact
serves float32; throughput serves bfloat16 on CPUs with native bfloat16 (AVX512_BF16 or
AMX-BF16 flags, injected here) and float32 elsewhere, bfloat16 or else float16 on GPUs."""

from __future__ import annotations

import pytest

from sr.config.precision import cpu_flags, resolve_precision

ZEN4 = frozenset({"fpu", "avx2", "avx512f", "avx512_bf16", "avx512_vnni"})
SAPPHIRE_RAPIDS = frozenset({"avx512f", "amx_tile", "amx_bf16", "amx_int8"})
SKYLAKE = frozenset({"fpu", "avx2", "avx512f", "avx512bw"})


@pytest.mark.parametrize(
    ("flags", "dtype", "because"),
    [
        (ZEN4, "bfloat16", "native bfloat16 (avx512_bf16)"),
        (SAPPHIRE_RAPIDS, "bfloat16", "native bfloat16 (amx_bf16)"),
        (ZEN4 | SAPPHIRE_RAPIDS, "bfloat16", "(amx_bf16, avx512_bf16)"),
        (SKYLAKE, "float32", "no native bfloat16"),
        (frozenset(), "float32", "neither avx512_bf16 nor amx_bf16"),
    ],
)
def test_throughput_on_cpu_serves_bfloat16_only_where_the_cpu_has_it(flags, dtype, because):
    served = resolve_precision("throughput", "auto", "cpu", cpu_flags=flags)
    assert (served.dtype, served.requested) == (dtype, "auto")
    assert because in served.reason


def test_exact_serves_float32_whatever_the_host():
    for device, gpu_bf16 in (("cpu", False), ("cuda:0", True), ("rocm:1", False)):
        served = resolve_precision("exact", "auto", device, cpu_flags=ZEN4, gpu_bf16=gpu_bf16)
        assert served.dtype == "float32"
        assert served.reason == "profile exact serves float32"


@pytest.mark.parametrize("explicit", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("profile", ["exact", "throughput"])
def test_an_explicit_dtype_always_wins(explicit, profile):
    for flags in (ZEN4, SKYLAKE):
        served = resolve_precision(profile, explicit, "cpu", cpu_flags=flags)
        assert (served.dtype, served.requested) == (explicit, explicit)
        assert served.reason == f"dtype {explicit} was asked for"


def test_throughput_on_a_gpu_serves_bfloat16_or_else_float16():
    served = resolve_precision("throughput", "auto", "cuda:0", gpu_bf16=True)
    assert served.dtype == "bfloat16" and "cuda:0" in served.reason
    served = resolve_precision("throughput", "auto", "cuda:0", cpu_flags=ZEN4, gpu_bf16=False)
    assert served.dtype == "float16" and "no bfloat16" in served.reason


def test_cpu_flags_come_from_the_first_flags_line(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx512f avx512_bf16\n\n"
        "processor\t: 1\nflags\t\t: fpu other\n"
    )
    assert cpu_flags(cpuinfo) == frozenset({"fpu", "avx512f", "avx512_bf16"})
    assert cpu_flags(tmp_path / "absent") == frozenset()
    (tmp_path / "noflags").write_text("processor\t: 0\n")
    assert cpu_flags(tmp_path / "noflags") == frozenset()
