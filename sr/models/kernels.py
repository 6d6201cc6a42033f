"""The two kernels a linear product can run on, as raw calls (no choice, no probe here).

* `blas`: `F.linear` on the weight as stored (MKL's SGEMM on CPU, cuBLAS on GPU). Any
  device, any dtype; the weight stays a view of the checkpoint file (shared pages).
* `onednn`: oneDNN's inner product on a weight reordered once into its blocked layout
  (`torch.ops.mkldnn._reorder_linear_weight`, then `_linear_pointwise`), with the bias,
  an erf GELU or a residual add fused into the product's epilogue. CPU only, float32 or
  bfloat16 (bfloat16 where oneDNN reports native support, i.e. AVX512_BF16 or AMX). The
  reordered weight is a private copy per process.

oneDNN creates one primitive per product shape and row count (~1.2 ms the first time a
row count is seen, measured at 384x1536) and caches it twice, in its own primitive cache
and in ideep's (torch's wrapper), ~0.4 MiB per entry together. At the libraries' default
capacities (1024 each) a server whose batches take many row counts grows by ~500 MiB;
`bound_onednn_caches` holds each at ONEDNN_CACHE_ENTRIES unless the operator set them.

Both compute `act(x @ weight.T + bias) [+ residual]`; they round differently (~1e-6 on
float32 activations of size ~1). Which one serves, and the row counts at which a row's
bits stop depending on the others', are measured per host (sr.models.linear,
sr.models.gemm_rows). Measured on an AMD EPYC (AVX-512) at 1 thread, MiniLM's shapes:
oneDNN is 1.2-1.6x faster than MKL at 10-3840 rows, and its rows are bit-identical alone
and in any longer product and at 1 and 2 threads; MKL's are not below 4 rows (12 at 2
threads).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sr.settings import default_process_variables

BLAS = "blas"
ONEDNN = "onednn"
KERNELS = (BLAS, ONEDNN)
# Activations a kernel applies inside the product; any other runs after it.
FUSED_ACTIVATIONS = ("gelu",)  # the exact (erf) GELU, F.gelu's default
# Cached primitives per cache: 64 row counts of a 4-product encoder (MiniLM) stay warm,
# at most ~110 MiB (measured: 200 new row counts of one shape held +2.9 MiB at 8 entries,
# +27 MiB at 64, +107 MiB at the defaults).
ONEDNN_CACHE_ENTRIES = 256
# The environment variables oneDNN and ideep read, once, when first used.
_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def bound_onednn_caches() -> None:
    """Hold oneDNN's and ideep's primitive caches at ONEDNN_CACHE_ENTRIES entries, unless
    the environment already sets them. Effective only before the process's first oneDNN
    primitive (the libraries read the variables once): sr.models.linear calls it before
    its probe."""
    default_process_variables({name: str(ONEDNN_CACHE_ENTRIES) for name in _CACHE_VARIABLES})


def onednn_unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why oneDNN's packed linear cannot serve this device and dtype; None when it can."""
    if device.type != "cpu":
        return f"{device.type}: oneDNN's packed linear is a CPU kernel"
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (mkldnn)"
    if dtype == torch.bfloat16:
        if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return "the CPU has no native bfloat16 (AVX512_BF16 or AMX)"
    elif dtype != torch.float32:
        return f"{str(dtype).removeprefix('torch.')} is served by BLAS"
    return None


def prepare(kernel: str, weight: torch.Tensor) -> torch.Tensor:
    """The weight as `kernel` multiplies it: as stored for BLAS, reordered for oneDNN."""
    if kernel == ONEDNN:
        return torch.ops.mkldnn._reorder_linear_weight(weight, None)
    return weight


def linear(
    kernel: str,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """`act(x @ weight.T + bias)`, plus `residual` when given (then no activation), with
    `weight` as `prepare(kernel, ...)` returned it."""
    if kernel == ONEDNN:
        if residual is not None:
            # Bit-identical to the product followed by `+ residual` (checked in tests).
            return torch.ops.mkldnn._linear_pointwise.binary(x, residual, weight, bias, "add")
        if activation is not None:
            return torch.ops.mkldnn._linear_pointwise(x, weight, bias, activation, [], "none")
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    out = F.linear(x, weight, bias)
    if activation == "gelu":
        return F.gelu(out)
    return out if residual is None else out + residual
