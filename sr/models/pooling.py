"""Sentence-transformers pooling over packed rows, one row at a time, then the checkpoint's
Dense modules (sr.models.dense) and Normalize, in that order.

Each row is reduced over exactly its own tokens, so a row's vector does not depend on the
other rows of the batch (no padding enters any sum).

The same rules twice: in numpy for hidden states on the CPU, in torch on a GPU (the states
stay on the device; only the pooled vectors leave it). Why numpy on the CPU: a torch
operator's dispatch costs 20-70 us on a slow 2-core host right after a forward, and pooling
a row takes about ten of them; measured on one short MiniLM text (onnxruntime engine), the
path from ORT's run to the vector took 0.46-0.77 ms in torch, 0.19-0.21 ms in numpy
(docs/decisions.md). Both are held to the same reference in the tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

# F.normalize's floor under a vector's length: an all-zero vector stays zero.
_NORM_EPS = 1e-12


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


def _pool_row_array(row: np.ndarray, mode: str, skip: int) -> np.ndarray:
    """`_pool_row` in numpy, on float32 [L, H]. A sum over the token axis adds whole token
    vectors in order, so a row's bits do not depend on where it lies in memory."""
    if mode == "lasttoken":
        return row[-1]
    tokens = row[skip:] if skip else row
    if mode == "mean":
        return tokens.sum(0) / np.float32(tokens.shape[0])
    if mode == "cls":
        return tokens[0]
    if mode == "max":
        return tokens.max(0)
    if mode == "mean_sqrt_len":
        return tokens.sum(0) / np.float32(math.sqrt(tokens.shape[0]))
    if mode == "weightedmean":
        weights = np.arange(skip + 1, skip + tokens.shape[0] + 1, dtype=np.float32)
        return (tokens * weights[:, None]).sum(0) / weights.sum()
    raise ValueError(f"unknown pooling mode {mode!r}")


def pool_arrays(
    rows: list[np.ndarray],
    modes: tuple[str, ...],
    normalize: bool,
    dense: Callable[[torch.Tensor], torch.Tensor] | None = None,
    pooled_from: list[int] | None = None,
) -> np.ndarray:
    """Each row's float32 hidden states [L, H] -> [n, H * len(modes)] float32, through
    `dense` (on the CPU, all rows at once) when given, then L2-normalised if asked.
    `pooled_from`: per row, how many of its first tokens pooling leaves out."""
    pooled = []
    for index, row in enumerate(rows):
        skip = pooled_from[index] if pooled_from is not None else 0
        parts = [_pool_row_array(row, mode, skip) for mode in modes]
        pooled.append(parts[0] if len(parts) == 1 else np.concatenate(parts))
    vectors = np.stack(pooled)
    if dense is not None:
        with torch.inference_mode():
            vectors = dense(torch.from_numpy(vectors)).numpy()
    if not normalize:
        return vectors
    # Row by row along the contiguous axis: numpy's pairwise sum, fixed by the row's size.
    lengths = np.sqrt(np.square(vectors).sum(1, keepdims=True))
    return vectors / np.maximum(lengths, np.float32(_NORM_EPS))


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
    how many of its first tokens pooling leaves out (None: none). On the CPU in numpy
    (`pool_arrays`), elsewhere in torch (`pool_tensors`): module doc."""
    if hidden.device.type != "cpu":
        return pool_tensors(hidden, lengths, modes, normalize, dense, pooled_from)
    states = hidden.numpy()
    rows, start = [], 0
    for length in lengths:
        rows.append(states[start : start + length])
        start += length
    return torch.from_numpy(pool_arrays(rows, modes, normalize, dense, pooled_from))


def pool_tensors(hidden, lengths, modes, normalize, dense=None, pooled_from=None) -> torch.Tensor:
    """`pool` in torch, on the device `hidden` lies on (the arguments are `pool`'s)."""
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
