"""How many rows a matrix multiply needs before its rows stop depending on the row count.

BLAS libraries pick different kernels for very short matrices: on MKL a row computed in a
3-row product can differ in the last bit from the same row in a 40-row product, and the
cut-off moves with the thread count (measured: under 4 rows at 1 thread, under 12 at 2,
under 28 at 16). Packed forwards shorter than the cut-off are padded up to it, so a text
gets the same bits alone as inside any batch. The cut-off is measured, not assumed: once
per (device, thread count, shape), on random data, in a few milliseconds.
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

PROBE_ROWS = 64  # the largest cut-off measured is 28 (16 threads); probe well past it

_lock = threading.Lock()
_cut_offs: dict[tuple[str, int, int, int], int] = {}


def _measure(device: torch.device, in_features: int, out_features: int) -> int:
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(PROBE_ROWS, in_features, generator=generator).to(device)
    w = torch.randn(out_features, in_features, generator=generator).to(device)
    b = torch.randn(out_features, generator=generator).to(device)
    with torch.inference_mode():
        reference = F.linear(x, w, b)
        worst = 0
        for rows in range(1, PROBE_ROWS):
            if not torch.equal(F.linear(x[:rows], w, b), reference[:rows]):
                worst = rows
    return worst + 1


def min_consistent_rows(device: torch.device, in_features: int, out_features: int) -> int:
    """Fewest rows at which a product's rows match those of a longer product, at the
    thread count now in force."""
    key = (str(device), torch.get_num_threads(), in_features, out_features)
    cut_off = _cut_offs.get(key)
    if cut_off is None:
        with _lock:
            cut_off = _cut_offs.get(key)
            if cut_off is None:
                cut_off = _cut_offs[key] = _measure(device, in_features, out_features)
    return cut_off


def consistent_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` whose rows have the same bits whatever the row count.

    A product with one output (a cross-encoder's relevance logit, a single-logit head)
    takes BLAS's matrix-vector path, whose rounding moves with the row count at every
    size (measured on MKL at 1 and 2 threads: rows differ at 193 of 299 row counts, with
    no cut-off), so it is a per-row sum here instead. Other shapes are padded with zero
    rows up to their own measured cut-off."""
    if weight.shape[0] == 1:
        out = (x * weight[0]).sum(dim=-1, keepdim=True)
        return out if bias is None else out + bias
    rows = x.shape[0]
    pad = min_consistent_rows(x.device, weight.shape[1], weight.shape[0]) - rows
    if pad > 0:
        x = F.pad(x, (0, 0, 0, pad))
    out = F.linear(x, weight, bias)
    return out[:rows] if pad > 0 else out
