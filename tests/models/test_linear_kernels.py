"""The kernel seam (sr.models.linear): which kernel serves and why, its fallback to BLAS,
what each kernel computes (against float64 and against the plain `F.linear` formulas the
families used before the seam), and the bits the packed kernel keeps in every family: rows
bit-identical alone and packed, and the same at 1 thread as at 2 (thread shadows)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers

from sr.models import kernels, linear, load_model
from sr.models.gemm_rows import PROBE_ROWS
from sr.models.kernels import BLAS, ONEDNN
from sr.models.linear import Linear, choose_kernel
from tests.models.reference import VOCAB, random_rows, sr_hidden, write_reference

CPU = torch.device("cpu")
onednn_here = kernels.onednn_unavailable(CPU, torch.float32) is None
requires_onednn = pytest.mark.skipif(not onednn_here, reason="no oneDNN for float32 here")
AVAILABLE = [BLAS, ONEDNN] if onednn_here else [BLAS]


@pytest.fixture
def fresh_choices(monkeypatch):
    """An empty per-process cache of kernel choices, restored afterwards."""
    monkeypatch.setattr(linear, "_choices", {})


# -- the choice ------------------------------------------------------------------------------


def test_blas_serves_when_asked_and_names_are_checked():
    assert choose_kernel(CPU, torch.float32, "blas").linear == BLAS
    with pytest.raises(ValueError, match="kernel 'mkl'"):
        choose_kernel(CPU, torch.float32, "mkl")


def test_onednn_is_refused_where_it_cannot_serve():
    assert "CPU kernel" in kernels.onednn_unavailable(torch.device("cuda", 0), torch.float32)
    assert "BLAS" in kernels.onednn_unavailable(CPU, torch.float16)
    assert choose_kernel(CPU, torch.float16).linear == BLAS
    with pytest.raises(ValueError, match="cannot serve here"):
        choose_kernel(CPU, torch.float16, "onednn")


@requires_onednn
def test_the_host_probe_picks_onednn_here(fresh_choices):
    choice = choose_kernel(CPU, torch.float32)
    assert choice.linear == ONEDNN
    assert "same bits at 1 and 2 threads" in choice.reason
    assert choice.card() == {"linear": ONEDNN, "reason": choice.reason}
    assert choose_kernel(CPU, torch.float32) is choice  # probed once per process


@requires_onednn
def test_bits_that_move_with_the_thread_count_mean_blas(fresh_choices, monkeypatch):
    monkeypatch.setattr(linear, "threads_agree", lambda *args: False)
    choice = choose_kernel(CPU, torch.float32)
    assert choice.linear == BLAS and "thread count" in choice.reason


@requires_onednn
def test_rows_that_move_with_the_row_count_mean_blas(fresh_choices, monkeypatch):
    monkeypatch.setattr(linear, "min_consistent_rows", lambda *args: PROBE_ROWS)
    choice = choose_kernel(CPU, torch.float32)
    assert choice.linear == BLAS and "row count" in choice.reason


@requires_onednn
def test_a_failing_onednn_means_blas(fresh_choices, monkeypatch):
    def refuse(*args):
        raise RuntimeError("could not create a primitive\nmore detail")

    monkeypatch.setattr(linear, "min_consistent_rows", refuse)
    choice = choose_kernel(CPU, torch.float32)
    assert choice.linear == BLAS
    assert choice.reason == "oneDNN failed: could not create a primitive"


def test_the_model_reports_its_kernel(tiny_model_dir):
    assert load_model(tiny_model_dir, kernel="blas").kernel_card["linear"] == BLAS
    # the tiny model (hidden 32) is too small for oneDNN to pay for its per-call cost
    served = load_model(tiny_model_dir).kernel_card
    assert served["linear"] == BLAS
    if onednn_here:
        assert "hidden size 32" in served["reason"]
        assert load_model(tiny_model_dir, kernel="onednn").kernel_card["linear"] == ONEDNN


def test_models_too_small_for_onednn_get_blas_unless_it_is_asked_for():
    packed = linear.KernelChoice(ONEDNN, "probed")
    small, large = linear.MIN_ONEDNN_HIDDEN - 1, linear.MIN_ONEDNN_HIDDEN
    assert linear.for_model(packed, small, None).linear == BLAS
    assert linear.for_model(packed, large, None) is packed
    assert linear.for_model(packed, small, "onednn") is packed
    blas = linear.KernelChoice(BLAS, "probed")
    assert linear.for_model(blas, large, None) is blas


# -- what a Linear computes ------------------------------------------------------------------


def _data(rows=7, n_in=48, n_out=40, seed=3):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n_in, generator=generator)
    w = torch.randn(n_out, n_in, generator=generator) * 0.2
    b = torch.randn(n_out, generator=generator)
    residual = torch.randn(rows, n_out, generator=generator)
    return x, w, b, residual


@pytest.mark.parametrize("kernel", AVAILABLE)
def test_each_product_matches_float64(kernel):
    x, w, b, residual = _data()
    exact = x.double() @ w.double().T + b.double()
    cases = {
        "plain": (Linear(w, b, kernel=kernel)(x), exact),
        "gelu": (Linear(w, b, kernel=kernel, activation="gelu")(x), F.gelu(exact)),
        "residual": (Linear(w, b, kernel=kernel)(x, residual=residual), exact + residual),
        "no bias": (Linear(w, kernel=kernel)(x), exact - b.double()),
    }
    parts = [(w[:10], b[:10]), (w[10:25], b[10:25]), (w[25:], b[25:])]
    cases["joined"] = (Linear.joined(parts, kernel=kernel)(x), exact)
    for name, (got, want) in cases.items():
        assert got.dtype == torch.float32 and got.shape == want.shape, name
        assert (got.double() - want).abs().max().item() < 1e-5, name


def test_blas_is_the_plain_formulas_bit_for_bit():
    """What the families computed before the seam, so `kernel="blas"` changes no bit."""
    x, w, b, residual = _data()
    assert torch.equal(Linear(w, b, kernel=BLAS)(x), F.linear(x, w, b))
    gelu = Linear(w, b, kernel=BLAS, activation="gelu")(x)
    assert torch.equal(gelu, F.gelu(F.linear(x, w, b)))
    assert torch.equal(Linear(w, b, kernel=BLAS)(x, residual), F.linear(x, w, b) + residual)
    parts = [(w[:20], b[:20]), (w[20:], b[20:])]
    joined = Linear.joined(parts, kernel=BLAS)(x)
    assert torch.equal(joined, torch.cat([F.linear(x, pw, pb) for pw, pb in parts], dim=-1))


@requires_onednn
def test_onednn_fused_residual_is_the_separate_add_bit_for_bit():
    x, w, b, residual = _data(rows=33, n_in=384, n_out=384)
    product = Linear(w, b, kernel=ONEDNN)
    assert torch.equal(product(x, residual=residual), product(x) + residual)


def test_unfusable_activations_and_mixed_biases_are_refused():
    _, w, b, _ = _data()
    with pytest.raises(ValueError, match="cannot be fused"):
        Linear(w, b, kernel=BLAS, activation="silu")
    with pytest.raises(ValueError, match="every part has a bias"):
        Linear.joined([(w[:20], b[:20]), (w[20:], None)], kernel=BLAS)


@pytest.mark.parametrize("kernel", AVAILABLE)
@pytest.mark.parametrize("n_out", [1, 20])
def test_consistent_rows_do_not_depend_on_the_row_count(kernel, n_out):
    x, w, b, _ = _data(rows=70, n_out=n_out)
    product = Linear(w, b, kernel=kernel)
    everything = product.consistent(x)
    for start, rows in ((0, 1), (3, 2), (10, 5), (40, 30), (69, 1)):
        got = product.consistent(x[start : start + rows])
        assert torch.equal(got, everything[start : start + rows]), (start, rows)
    if n_out == 1:  # a per-row sum on every kernel
        assert product.kernel == BLAS


# -- every family on the packed kernel -------------------------------------------------------

LENGTHS = [1, 2, 5, 5, 17, 40, 3]
SMALL = dict(vocab_size=VOCAB, hidden_size=48, num_hidden_layers=2, num_attention_heads=4)
FAMILIES = {
    "bert": lambda: transformers.BertConfig(
        **SMALL, intermediate_size=96, max_position_embeddings=128, num_labels=3
    ),
    "xlm-roberta": lambda: transformers.XLMRobertaConfig(
        **SMALL, intermediate_size=96, max_position_embeddings=130, pad_token_id=1, num_labels=3
    ),
    "mpnet": lambda: transformers.MPNetConfig(
        **SMALL, intermediate_size=96, max_position_embeddings=160, num_labels=3
    ),
    "modernbert": lambda: transformers.ModernBertConfig(
        **SMALL,
        intermediate_size=40,
        max_position_embeddings=128,
        local_attention=8,
        pad_token_id=0,
        bos_token_id=101,
        eos_token_id=102,
        cls_token_id=101,
        sep_token_id=102,
        num_labels=3,
    ),
    "qwen3": lambda: transformers.Qwen3Config(
        **SMALL,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=3,
        pad_token_id=0,
    ),
}


def _forwards(model, rows):
    """Hidden states and logits of `rows` packed together, and of each row alone."""
    packed = sr_hidden(model, rows), model.classify_logits(rows)
    alone = [(sr_hidden(model, [row])[0], model.classify_logits([row])[0]) for row in rows]
    return packed, alone


@requires_onednn
@pytest.mark.parametrize("family", list(FAMILIES))
def test_packed_kernel_rows_alone_and_packed_and_at_1_and_2_threads(family, tmp_path):
    folder = write_reference(tmp_path, FAMILIES[family](), head=True)
    model = load_model(folder, kernel="onednn")  # tiny: `auto` would pick BLAS
    assert model.kernel_card["linear"] == ONEDNN
    rows = random_rows(LENGTHS)
    by_threads = {}
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            model.calibrate_threads()
            (hidden, logits), alone = _forwards(model, rows)
            for i, (row_hidden, row_logits) in enumerate(alone):
                assert torch.equal(row_hidden, hidden[i]), (threads, len(rows[i]))
                assert torch.equal(row_logits, logits[i]), (threads, len(rows[i]))
            by_threads[threads] = (hidden, logits)
    finally:
        torch.set_num_threads(before)
    (hidden_1, logits_1), (hidden_2, logits_2) = by_threads[1], by_threads[2]
    assert all(torch.equal(a, b) for a, b in zip(hidden_1, hidden_2, strict=True))
    assert torch.equal(logits_1, logits_2)
