"""Sentence-transformers pooling over packed rows, one row at a time, then the checkpoint's
Dense modules (sr.models.dense) and Normalize, in that order.

Each row is reduced over exactly its own tokens, so a row's vector does not depend on the
other rows of the batch (no padding enters any sum).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F


def _pool_row(row: torch.Tensor, mode: str, skip: int) -> torch.Tensor:
    """One row's tokens [L, H] pooled by `mode`, the first `skip` tokens left out (as
    sentence-transformers masks a prompt's tokens under `include_prompt: false`: the last
    token is the row's last whatever the mask, weights keep their positions)."""
    if mode == "lasttoken":
        return row[-1]
    tokens = row[skip:] if skip else row
    if mode == "mean":
        return tokens.sum(0) / tokens.shape[0]
    if mode == "cls":
        return tokens[0]
    if mode == "max":
        return tokens.max(0).values
    if mode == "mean_sqrt_len":
        return tokens.sum(0) / math.sqrt(tokens.shape[0])
    if mode == "weightedmean":
        # Position weights 1..n, as sentence-transformers' weighted mean.
        weights = torch.arange(
            skip + 1, skip + tokens.shape[0] + 1, device=tokens.device, dtype=tokens.dtype
        )
        return (tokens * weights[:, None]).sum(0) / weights.sum()
    raise ValueError(f"unknown pooling mode {mode!r}")


def pool(
    hidden: torch.Tensor,
    lengths: list[int],
    modes: tuple[str, ...],
    normalize: bool,
    dense: Callable[[torch.Tensor], torch.Tensor] | None = None,
    pooled_from: list[int] | None = None,
) -> torch.Tensor:
    """hidden [T, H] of packed rows -> [n, H * len(modes)], through `dense` (all rows at
    once: a DenseStack) when given, then L2-normalised if asked. `pooled_from`: per row,
    how many of its first tokens pooling leaves out (None: none)."""
    if len(lengths) == 1 and len(modes) == 1:
        # One row (a one-text request): its tokens are all of `hidden`, and its vector as a
        # [1, H] view is what stacking it alone copies.
        pooled = _pool_row(hidden, modes[0], pooled_from[0] if pooled_from else 0).unsqueeze(0)
        if dense is not None:
            pooled = dense(pooled)
        return F.normalize(pooled, p=2.0, dim=1) if normalize else pooled
    rows = []
    start = 0
    for index, length in enumerate(lengths):
        tokens = hidden[start : start + length]
        start += length
        skip = pooled_from[index] if pooled_from is not None else 0
        parts = [_pool_row(tokens, mode, skip) for mode in modes]
        rows.append(parts[0] if len(parts) == 1 else torch.cat(parts))
    pooled = torch.stack(rows)
    if dense is not None:
        pooled = dense(pooled)
    return F.normalize(pooled, p=2.0, dim=1) if normalize else pooled
