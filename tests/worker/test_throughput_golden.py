"""The golden check reports the deviation from float32 it measured (max abs diff and least
row cosine, and against what): the recorded float32 reference when the weights have one,
else, at a reduced precision, a float32 forward of the same weights."""

from __future__ import annotations

import torch

from sr.models import EMBEDDED_DEFAULT, golden_check, load_model, resolve_artifact
from sr.models.golden import FLOAT32_FORWARD


def test_float32_with_a_reference_reports_its_least_cosine():
    result = golden_check(load_model(resolve_artifact(EMBEDDED_DEFAULT)))
    assert result.passed, result.reason
    assert result.against == result.reference == "golden_minilm.json"
    assert result.max_abs_diff <= 1e-5
    assert 1 - 1e-9 <= result.min_cosine <= 1 + 1e-12


def test_float32_without_a_reference_measures_nothing(tiny_model_dir):
    result = golden_check(load_model(tiny_model_dir))
    assert result.passed and "no recorded reference" in result.reason
    assert (result.against, result.max_abs_diff, result.min_cosine) == (None, None, None)


def test_bfloat16_without_a_reference_is_measured_against_a_float32_forward(tiny_model_dir):
    model = load_model(tiny_model_dir, dtype="bfloat16")
    result = golden_check(model)
    assert result.passed, result.reason
    assert (result.against, result.reference) == (FLOAT32_FORWARD, None)
    assert "a float32 forward of the same weights at bfloat16" in result.reason
    # bfloat16 rounds: not zero, and inside the bound REDUCED_PRECISION[bfloat16]
    assert 0 < result.max_abs_diff <= 1e-2
    assert 0.999 <= result.min_cosine < 1


def test_a_float32_forward_beyond_the_bound_fails_the_check(tiny_model_dir):
    model = load_model(tiny_model_dir, dtype="bfloat16")
    calls = []

    def drifted(ids):  # a float32 answer far from what bfloat16 computes
        calls.append(len(ids))
        return torch.nn.functional.normalize(torch.ones(len(ids), model.embedding_dim), dim=1)

    result = golden_check(model, float32_embed=drifted)
    assert calls == [8]  # the eight golden inputs, once
    assert not result.passed
    assert result.reason.startswith("at bfloat16: max abs diff")
    assert result.reason.endswith("from a float32 forward of the same weights")
    assert result.min_cosine < 0.999 and result.against == FLOAT32_FORWARD


def test_a_float32_forward_that_raises_fails_the_check_with_its_reason(tiny_model_dir):
    model = load_model(tiny_model_dir, dtype="bfloat16")

    def broken(ids):
        raise MemoryError("no room for a second copy")

    result = golden_check(model, float32_embed=broken)
    assert not result.passed
    assert result.reason == (
        "float32 forward for comparison raised MemoryError: no room for a second copy"
    )
