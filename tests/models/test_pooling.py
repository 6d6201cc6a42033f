"""sr.models.pooling's two implementations, numpy (`pool_arrays`, the CPU's) and torch
(`pool_tensors`, a GPU's), against one reference computed as sentence-transformers' Pooling
computes it: a padded batch with an attention mask, in float64. Every mode, with and without
a prompt's tokens left out, normalised or not; a row's bits never depend on the rows beside
it or on where it lies in memory."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sr.models.pooling import pool, pool_arrays, pool_tensors

MODES = ("cls", "max", "mean", "mean_sqrt_len", "weightedmean", "lasttoken")
LENGTHS = [1, 3, 9, 17, 64]
WIDTH = 48


def _rows(seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(n, WIDTH, generator=generator) for n in LENGTHS]


def _reference(rows, mode: str, skips: list[int], normalize: bool) -> torch.Tensor:
    """A padded [n, L, H] batch, the prompt's tokens masked out: the masked reductions of
    sentence-transformers' Pooling (lasttoken: the row's last token; weights: positions)."""
    longest = max(len(row) for row in rows)
    hidden = torch.zeros(len(rows), longest, WIDTH, dtype=torch.float64)
    mask = torch.zeros(len(rows), longest, dtype=torch.float64)
    for i, (row, skip) in enumerate(zip(rows, skips, strict=True)):
        hidden[i, : len(row)] = row.double()
        mask[i, skip : len(row)] = 1
    counts = mask.sum(1, keepdim=True)
    masked = hidden * mask[..., None]
    if mode == "cls":
        out = torch.stack([hidden[i, skip] for i, skip in enumerate(skips)])
    elif mode == "max":
        out = hidden.masked_fill(mask[..., None] == 0, -math.inf).max(1).values
    elif mode == "mean":
        out = masked.sum(1) / counts
    elif mode == "mean_sqrt_len":
        out = masked.sum(1) / counts.sqrt()
    elif mode == "weightedmean":
        weights = torch.arange(1, longest + 1, dtype=torch.float64)[None, :] * mask
        out = (hidden * weights[..., None]).sum(1) / weights.sum(1, keepdim=True)
    else:
        out = torch.stack([hidden[i, len(row) - 1] for i, row in enumerate(rows)])
    return torch.nn.functional.normalize(out, dim=1) if normalize else out


def _numpy(rows, modes, normalize, skips=None) -> torch.Tensor:
    arrays = [row.numpy() for row in rows]
    return torch.from_numpy(pool_arrays(arrays, modes, normalize, None, skips))


def _torch(rows, modes, normalize, skips=None) -> torch.Tensor:
    return pool_tensors(torch.cat(rows), LENGTHS, modes, normalize, None, skips)


IMPLEMENTATIONS = {"numpy": _numpy, "torch": _torch}


@pytest.mark.parametrize("normalize", [True, False], ids=["normalized", "raw"])
@pytest.mark.parametrize("prompt", [False, True], ids=["every token", "prompt left out"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("implementation", list(IMPLEMENTATIONS))
def test_each_mode_matches_the_masked_reference(implementation, mode, prompt, normalize):
    rows = _rows()
    skips = [min(2, n - 1) for n in LENGTHS] if prompt else None
    got = IMPLEMENTATIONS[implementation](rows, (mode,), normalize, skips)
    want = _reference(rows, mode, skips or [0] * len(rows), normalize)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert (got.double() - want).abs().max().item() < 1e-5


@pytest.mark.parametrize("implementation", list(IMPLEMENTATIONS))
def test_several_modes_concatenate_in_the_order_given(implementation):
    rows = _rows(1)
    got = IMPLEMENTATIONS[implementation](rows, ("cls", "mean"), True)
    zero = [0] * len(rows)
    want = torch.cat([_reference(rows, m, zero, False) for m in ("cls", "mean")], dim=1)
    want = torch.nn.functional.normalize(want, dim=1)
    assert (got.double() - want).abs().max().item() < 1e-5


def test_a_rows_numpy_bits_do_not_depend_on_its_neighbours_or_its_offset():
    rows = _rows(2)
    packed = torch.cat(rows).numpy()
    modes = ("cls", "max", "mean", "weightedmean")
    starts = np.cumsum([0, *LENGTHS[:-1]])
    views = [packed[s : s + n] for s, n in zip(starts, LENGTHS, strict=True)]
    together = pool_arrays(views, modes, True)
    for i, row in enumerate(rows):
        for pad in (0, 1, 3):  # the row copied to start 0, 4 and 12 bytes into a buffer
            buffer = np.zeros(pad + row.numel(), dtype=np.float32)
            buffer[pad:] = row.numpy().ravel()
            alone = pool_arrays([buffer[pad:].reshape(row.shape)], modes, True)
            assert np.array_equal(alone[0], together[i]), (i, pad)


def test_pool_on_the_cpu_is_the_numpy_implementation_bit_for_bit():
    rows = _rows(3)
    got = pool(torch.cat(rows), LENGTHS, ("mean",), True)
    assert torch.equal(got, _numpy(rows, ("mean",), True))


@pytest.mark.parametrize("implementation", list(IMPLEMENTATIONS))
def test_a_zero_vector_stays_zero_when_normalised(implementation):
    rows = [torch.zeros(n, WIDTH) for n in LENGTHS]
    got = IMPLEMENTATIONS[implementation](rows, ("mean",), True)
    assert torch.equal(got, torch.zeros(len(LENGTHS), WIDTH))


@pytest.mark.parametrize("implementation", list(IMPLEMENTATIONS))
def test_an_unknown_mode_is_refused_by_name(implementation):
    with pytest.raises(ValueError, match="'median'"):
        IMPLEMENTATIONS[implementation](_rows(), ("median",), False)
