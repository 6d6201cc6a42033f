"""Which precision a worker serves: the rule behind `dtype: auto`.

An explicit dtype (float32, bfloat16, float16) is always what is served. `auto`, the
worker's default, lets the profile decide on the host the worker runs on:
- profile `exact`: float32, whose answers match the recorded float32 references;
- profile `throughput` on cpu: bfloat16 when the CPU has native bfloat16 dot products
  (the `avx512_bf16` or `amx_bf16` flag), float32 otherwise: without them torch emulates
  bfloat16 matmuls through float32 and they are slower than float32 itself;
- profile `throughput` on a GPU: bfloat16 when the device supports it, else float16.
The result says why, in words the card and the start log carry.

Pure: the CPU flags and the GPU's bfloat16 support are arguments (`cpu_flags()` reads
/proc/cpuinfo; no torch here, so the router may apply the rule too).
"""

from __future__ import annotations

from pathlib import Path

import attrs

AUTO_DTYPE = "auto"
# x86 flags of native bfloat16 arithmetic that oneDNN's bfloat16 kernels use.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


@attrs.frozen
class Precision:
    """The dtype a worker serves, what was asked for, and why."""

    dtype: str  # float32 | bfloat16 | float16
    requested: str  # auto or an explicit dtype
    reason: str

    def card(self) -> dict:
        return attrs.asdict(self)


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags (the first `flags` line); empty when unreadable (not Linux)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def resolve_precision(
    profile: str,
    requested: str,
    device: str,
    *,
    cpu_flags: frozenset[str] = frozenset(),
    gpu_bf16: bool = False,
    engine: str = "torch",
) -> Precision:
    """The dtype served for `requested` (a dtype or `auto`) under `profile` on `device`."""
    if requested != AUTO_DTYPE:
        return Precision(requested, requested, f"dtype {requested} was asked for")
    if engine == "onnxruntime":
        return Precision("float32", requested, "engine onnxruntime serves float32")
    if profile != "throughput":
        return Precision("float32", requested, f"profile {profile} serves float32")
    if device == "cpu":
        native = sorted(flag for flag in BF16_CPU_FLAGS if flag in cpu_flags)
        if native:
            return Precision(
                "bfloat16",
                requested,
                f"profile throughput on a CPU with native bfloat16 ({', '.join(native)})",
            )
        return Precision(
            "float32",
            requested,
            "profile throughput, but the CPU has no native bfloat16 (neither "
            f"{' nor '.join(BF16_CPU_FLAGS)}): bfloat16 would be slower than float32",
        )
    if gpu_bf16:
        return Precision("bfloat16", requested, f"profile throughput on {device} with bfloat16")
    return Precision("float16", requested, f"profile throughput on {device}, which has no bfloat16")
