"""Precision as an engine arg (`load_model(..., dtype=)`): float32 unchanged to the bit,
bfloat16/float16 close to float32 (and no further from it than transformers at the same
dtype), answers float32 whatever the dtype, the golden check at the dtype served."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers
from reference import VOCAB, random_rows, sr_hidden, write_reference

from sr.models import EMBEDDED_DEFAULT, golden_check, load_model, resolve_artifact
from sr.models.blocks import float32_on, torch_dtype, weights_on
from sr.models.golden import REDUCED_PRECISION, golden_token_ids
from sr.worker.warmup import batch_invariance_probe

TEXTS = [
    "hello world",
    "the quick brown fox jumps over the lazy dog",
    "a",
    "route this to billing please, it is urgent " * 4,
]
# Tiny random models, unit-normalised embeddings: bfloat16 keeps 8 mantissa bits (a
# relative step of 2**-8 = 3.9e-3 per rounding), float16 11 (4.9e-4). Measured on the tiny
# BERT: max abs diff 3.1e-3 / 3.3e-4 and least cosine 0.99998 / 0.9999997; the bounds
# leave ~5x (abs) and >= 10x (1 - cosine) of room for other CPUs' kernels.
CLOSE = {"bfloat16": (1.5e-2, 0.999), "float16": (2e-3, 0.9999)}


class _Direct:
    def run(self, fn, padded):
        return fn()


@pytest.fixture(scope="module")
def minilm_dir():
    return resolve_artifact(EMBEDDED_DEFAULT)


def _families():
    common = dict(vocab_size=VOCAB, num_attention_heads=4)
    return {
        "bert": transformers.BertConfig(
            **common, hidden_size=48, num_hidden_layers=2, intermediate_size=96,
            max_position_embeddings=160,
        ),
        "mpnet": transformers.MPNetConfig(
            **common, hidden_size=48, num_hidden_layers=2, intermediate_size=96,
            max_position_embeddings=160,
        ),
        "modernbert": transformers.ModernBertConfig(
            **common, hidden_size=48, num_hidden_layers=3, intermediate_size=40,
            max_position_embeddings=128, global_attn_every_n_layers=2, local_attention=8,
            global_rope_theta=1000.0, local_rope_theta=50.0, pad_token_id=0,
            bos_token_id=101, eos_token_id=102, cls_token_id=101, sep_token_id=102,
        ),
        "qwen3": transformers.Qwen3Config(
            **common, hidden_size=48, num_hidden_layers=2, num_key_value_heads=2, head_dim=16,
            intermediate_size=64, max_position_embeddings=128, attention_bias=True,
        ),
    }  # fmt: skip


@pytest.fixture(scope="module", params=["bert", "mpnet", "modernbert", "qwen3"])
def family_dir(request, tmp_path_factory):
    config = _families()[request.param]
    return write_reference(tmp_path_factory.mktemp(request.param), config, head=True)


def test_dtype_names_and_weight_casts():
    assert torch_dtype("bfloat16") is torch.bfloat16
    assert torch_dtype(torch.float16) is torch.float16
    with pytest.raises(ValueError, match="dtype 'fp8' is not supported"):
        torch_dtype("fp8")
    t = torch.randn(3, 2, dtype=torch.float64)
    assert weights_on(torch.device("cpu"))(t).dtype == torch.float32
    assert weights_on(torch.device("cpu"), "bfloat16")(t).dtype == torch.bfloat16
    assert torch.equal(float32_on(torch.device("cpu"))(t), weights_on(torch.device("cpu"))(t))


def test_unknown_dtype_is_refused_at_load(tiny_model_dir):
    with pytest.raises(ValueError, match="dtype 'int8' is not supported"):
        load_model(tiny_model_dir, dtype="int8")


def test_float32_is_the_default_and_unchanged_to_the_bit(family_dir):
    rows = random_rows([1, 5, 5, 17, 40, 3])
    default, explicit = load_model(family_dir), load_model(family_dir, dtype="float32")
    assert default.dtype == explicit.dtype == torch.float32
    for got, want in zip(sr_hidden(explicit, rows), sr_hidden(default, rows), strict=True):
        assert got.dtype == torch.float32 and torch.equal(got, want)
    assert torch.equal(explicit.embed(rows), default.embed(rows))
    assert torch.equal(explicit.classify_logits(rows), default.classify_logits(rows))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_reduced_precision_computes_in_it_and_answers_in_float32(family_dir, dtype):
    rows = random_rows([1, 5, 5, 17, 40, 3])
    model = load_model(family_dir, dtype=dtype)
    assert model.dtype == torch_dtype(dtype)
    assert sr_hidden(model, rows)[0].dtype == torch_dtype(dtype)
    vectors, logits = model.embed(rows), model.classify_logits(rows)
    assert vectors.dtype == logits.dtype == torch.float32
    assert vectors.device.type == logits.device.type == "cpu"
    assert torch.isfinite(vectors).all() and torch.isfinite(logits).all()


def test_bfloat16_hidden_states_are_as_close_to_float32_as_transformers_at_bfloat16(family_dir):
    """The upcasts mirror transformers' (RMSNorm variance in float32, ModernBERT's rotary
    in float32, rotary tables cast to the dtype): sr's bfloat16 error is of the size of
    transformers' own bfloat16 error (measured ratio 0.7-1.1 over the four families)."""
    rows = random_rows([1, 5, 17, 40])
    auto = transformers.AutoModel

    def reference(dtype):
        model = auto.from_pretrained(family_dir, attn_implementation="eager", dtype=dtype).eval()
        with torch.no_grad():
            return [model(input_ids=torch.tensor([r])).last_hidden_state[0].float() for r in rows]

    exact, theirs = reference(torch.float32), reference(torch.bfloat16)
    ours = [h.float() for h in sr_hidden(load_model(family_dir, dtype="bfloat16"), rows)]

    def error(got):
        return max((g - e).abs().max().item() for g, e in zip(got, exact, strict=True))

    assert 0 < error(ours) <= 2 * error(theirs)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_tiny_model_embeddings_close_to_float32(tiny_model_dir, dtype):
    reference = load_model(tiny_model_dir)
    low = load_model(tiny_model_dir, dtype=dtype)
    ids = reference.tokenize(TEXTS)
    want, got = reference.embed(ids), low.embed(ids)
    max_abs, least_cosine = CLOSE[dtype]
    assert not torch.equal(got, want)  # really computed in another precision
    assert (got - want).abs().max().item() <= max_abs
    assert F.cosine_similarity(got, want).min().item() >= least_cosine
    # normalised in float32 after pooling: unit length to float32 precision
    assert torch.allclose(got.norm(dim=1), torch.ones(len(TEXTS)), atol=1e-6)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_golden_check_passes_at_reduced_precision_for_the_embedded_minilm(minilm_dir, dtype):
    model = load_model(minilm_dir, dtype=dtype)
    result = golden_check(model)
    assert result.passed, result.reason
    assert result.reference == "golden_minilm.json"
    bound, _ = REDUCED_PRECISION[torch_dtype(dtype)]
    assert 0 < result.max_abs_diff <= bound
    assert f"at {dtype}" in result.reason and "least cosine" in result.reason


def test_golden_check_at_bfloat16_fails_past_its_bound(minilm_dir, monkeypatch):
    model = load_model(minilm_dir, dtype="bfloat16")
    monkeypatch.setitem(REDUCED_PRECISION, torch.bfloat16, (1e-4, 0.999))
    result = golden_check(model)
    assert not result.passed
    assert "at bfloat16: max abs diff" in result.reason and "bound 0.0001" in result.reason


def test_golden_check_at_float32_keeps_the_spec_bound(minilm_dir):
    result = golden_check(load_model(minilm_dir))
    assert result.passed and result.max_abs_diff <= 1e-5
    assert "least cosine" not in result.reason


def test_bfloat16_minilm_embeddings_close_to_float32(minilm_dir):
    """The numbers in the notes: bfloat16 vs float32 on the golden inputs."""
    f32, bf16 = load_model(minilm_dir), load_model(minilm_dir, dtype="bfloat16")
    ids = golden_token_ids(f32)
    want, got = f32.embed(ids), bf16.embed(ids)
    assert (got - want).abs().max().item() <= 1e-2  # measured 2.0e-3
    assert F.cosine_similarity(got, want).min().item() >= 0.999  # measured 0.99993


def test_the_probe_runs_at_the_dtype_served(tiny_head_model_dir):
    model = load_model(tiny_head_model_dir, dtype="bfloat16")
    result = batch_invariance_probe(model, _Direct(), 64)
    # Whether bfloat16 kernels keep rows bit-identical is the hardware's to say (it does on
    # the AVX-512 CPUs measured); the detail names the dtype either way.
    assert result.detail.endswith("at bfloat16")
    plain = batch_invariance_probe(load_model(tiny_head_model_dir), _Direct(), 64)
    assert plain.passed and not plain.detail.endswith("float32")
