"""Bidirectional Gemma3 (sr.models.gemma3) against transformers on tiny random checkpoints
(tests/models/reference.py): hidden states within 1e-5 at float32 on rows longer than the
sliding window, each row bit-identical alone and packed, the window's exact bound, an
EmbeddingGemma-shaped sentence-transformers folder (mean Pooling, two Dense, Normalize)
against sentence-transformers itself, and refused options."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file

from sr.errors import UnsupportedModel
from sr.models import load_model
from sr.models.gemma3 import gemma_rms_norm
from tests.models.reference import (
    VOCAB,
    assert_close_and_packing_invariant,
    random_rows,
    reference_hidden,
    sr_hidden,
    write_reference,
)

# Equal lengths share an attention group (the 5s side by side, the 17s apart); with a
# window of 8 (each token sees 4 each side) rows of 1-5 tokens need no window mask, 6 is
# the first that does, 17-40 cross it several times.
LENGTHS = [1, 5, 5, 6, 17, 40, 3, 17, 30]
TOLERANCE = 1e-5
SLIDING, FULL = "sliding_attention", "full_attention"


# The features Gemma3 adds to Qwen3's, all reached by the rows above: sliding and full
# layers mixed, each kind with its own rope theta, query_pre_attn_scalar other than
# head_dim, grouped-query attention, head_dim set apart from hidden / heads. No head is 8
# wide (torch's SDPA, not sr, gives odd rows other bits alone than grouped at head_dim 8:
# see test_family_qwen3).
def _mixed(**extra):
    return transformers.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, intermediate_size=96, max_position_embeddings=128,
        sliding_window=8, layer_types=[SLIDING, FULL, SLIDING, FULL],
        query_pre_attn_scalar=24, use_bidirectional_attention=True,
        rope_parameters={FULL: {"rope_type": "default", "rope_theta": 50_000.0},
                         SLIDING: {"rope_type": "default", "rope_theta": 100.0}},
        **extra,
    )  # fmt: skip


# An odd window (9: transformers keeps 9 // 2 + 1 = 5, |i - j| < 5), 4 query heads per
# key/value head, q/k/v/o biases, another eps, sliding layers first and last.
def _odd_window_bias(**extra):
    return transformers.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=48, num_hidden_layers=3, num_attention_heads=8,
        num_key_value_heads=2, head_dim=16, intermediate_size=80, max_position_embeddings=64,
        sliding_window=9, layer_types=[SLIDING, FULL, SLIDING], attention_bias=True,
        rms_norm_eps=1e-5, use_bidirectional_attention=True, **extra,
    )  # fmt: skip


CONFIGS = {"mixed": _mixed, "odd-window-bias": _odd_window_bias}


def _only(kind: str, window: int = 8):
    """One layer of one kind: what a token sees is what that layer's mask lets through."""
    return transformers.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, intermediate_size=48, max_position_embeddings=64,
        sliding_window=window, layer_types=[kind], use_bidirectional_attention=True,
    )  # fmt: skip


@pytest.fixture(scope="module", params=list(CONFIGS))
def checkpoint(request, tmp_path_factory):
    return write_reference(tmp_path_factory.mktemp(request.param), CONFIGS[request.param]())


def _max_diff(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got - want).abs().max().item()


def _edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is _DROP:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))


_DROP = object()


def test_hidden_states_match_transformers_and_rows_are_the_same_alone_and_packed(checkpoint):
    model = load_model(checkpoint)
    backbone = model.backbone
    config = json.loads((checkpoint / "config.json").read_text())
    # The features are really on: fewer key/value heads, head_dim not hidden / heads, both
    # layer kinds, a window the longer rows cross.
    assert backbone.num_kv_heads < backbone.num_heads
    assert backbone.head_dim * backbone.num_heads != config["hidden_size"]
    assert {layer.window for layer in backbone.layers} == {True, False}
    assert max(LENGTHS) > 3 * backbone.window
    rows = random_rows(LENGTHS)
    expected = reference_hidden(checkpoint, rows)
    assert_close_and_packing_invariant(model, rows, expected, TOLERANCE)


@pytest.mark.parametrize("window", [8, 9])
def test_sliding_layer_sees_window_half_each_side_as_transformers_does(tmp_path, window):
    """transformers' bidirectional window: config.json's W becomes W // 2 + 1 and a token
    attends where |i - j| < that, i.e. |i - j| <= W // 2. A token at W // 2 + 1 from the
    first one does not reach its state; one at W // 2 does."""
    folder = write_reference(tmp_path, _only(SLIDING, window))
    model = load_model(folder)
    reach = window // 2
    (row,) = random_rows([3 * window], seed=5)

    def changed(at: int) -> list[int]:
        return [*row[:at], row[at] + 1, *row[at + 1 :]]

    base, outside, inside = sr_hidden(model, [row, changed(reach + 1), changed(reach)])
    assert torch.equal(base[0], outside[0])
    assert not torch.equal(base[0], inside[0])
    # Token reach + 1 itself is changed; everything within reach of it moves, nothing else.
    moved = (base != outside).any(dim=1).nonzero().flatten().tolist()
    assert moved == list(range(1, 2 * reach + 2))
    # And transformers draws the same bound.
    ref_base, ref_outside, ref_inside = reference_hidden(
        folder, [row, changed(reach + 1), changed(reach)]
    )
    assert torch.equal(ref_base[0], ref_outside[0])
    assert not torch.equal(ref_base[0], ref_inside[0])
    for got, want in zip((base, outside, inside), (ref_base, ref_outside, ref_inside),
                         strict=True):  # fmt: skip
        assert _max_diff(got, want) <= TOLERANCE


def test_full_layers_are_bidirectional(tmp_path):
    """Not causal: a row's first state depends on its last token (what a causal slip, as
    in a generative Gemma3, would break)."""
    folder = write_reference(tmp_path, _only(FULL))
    model = load_model(folder)
    (a,) = random_rows([20], seed=4)
    b = [*a[:-1], a[-1] + 1]
    states_a, states_b = sr_hidden(model, [a, b])
    assert not torch.equal(states_a[0], states_b[0])
    for got, want in zip(sr_hidden(model, [a, b]), reference_hidden(folder, [a, b]),
                         strict=True):  # fmt: skip
        assert _max_diff(got, want) <= TOLERANCE


def test_legacy_config_keys(tmp_path):
    """config.json as transformers 4 wrote Gemma3 configs: `rope_theta` and
    `rope_local_base_freq` at the top, `rope_scaling` null; and, without `layer_types`,
    the layer kinds from `sliding_window_pattern` (every second layer full here)."""
    folder = write_reference(tmp_path, _mixed())
    _edit_config(
        folder, rope_parameters=_DROP, layer_types=_DROP, _sliding_window_pattern=_DROP,
        rope_theta=20_000.0, rope_local_base_freq=30.0, rope_scaling=None,
        sliding_window_pattern=2,
    )  # fmt: skip
    model = load_model(folder)
    assert [layer.window for layer in model.backbone.layers] == [True, False, True, False]
    rows = random_rows([7, 30], seed=2)
    for got, want in zip(sr_hidden(model, rows), reference_hidden(folder, rows), strict=True):
        assert _max_diff(got, want) <= TOLERANCE


def test_bfloat16_is_as_close_to_float32_as_transformers_at_bfloat16(checkpoint):
    """The dtype rules mirror transformers' (embedding scale rounded to the dtype, norms in
    float32 cast last, rotary tables cast to the dtype): sr's bfloat16 error is of the size
    of transformers' own, and rows stay bit-identical alone and packed."""
    rows = random_rows([1, 6, 17, 40])

    def reference(dtype):
        model = transformers.AutoModel.from_pretrained(
            checkpoint, attn_implementation="eager", dtype=dtype
        ).eval()
        with torch.no_grad():
            return [model(input_ids=torch.tensor([r])).last_hidden_state[0].float() for r in rows]

    exact, theirs = reference(torch.float32), reference(torch.bfloat16)
    model = load_model(checkpoint, dtype="bfloat16")
    packed = sr_hidden(model, rows)
    assert packed[0].dtype == torch.bfloat16
    for row, got in zip(rows, packed, strict=True):
        (alone,) = sr_hidden(model, [row])
        assert torch.equal(alone, got)

    def error(got):
        return max((g.float() - e).abs().max().item() for g, e in zip(got, exact, strict=True))

    assert 0 < error(packed) <= 2 * error(theirs)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_embedding_scale_and_norms_have_transformers_bits_at_reduced_precision(checkpoint, dtype):
    """The two dtype rules Gemma3 adds: sqrt(hidden_size) rounded to the dtype before it
    scales the embeddings (sqrt(48) = 6.9282 is 6.9375 in bfloat16), and RMSNorm times
    (1 + weight) in float32, cast last."""
    precision = getattr(torch, dtype)
    theirs = transformers.AutoModel.from_pretrained(
        checkpoint, attn_implementation="eager", dtype=precision
    ).eval()
    ours = load_model(checkpoint, dtype=dtype).backbone
    ids = torch.tensor(random_rows([40], seed=7)[0])
    x = torch.randn(40, ours.hidden_size, generator=torch.Generator().manual_seed(8))
    x = (x * 3).to(precision)
    q = torch.randn(40, ours.num_heads, ours.head_dim, generator=torch.Generator().manual_seed(9))
    q = q.to(precision)
    layer, their_layer = ours.layers[0], theirs.layers[0]
    with torch.no_grad():
        assert torch.equal(ours.embed[ids] * ours.embed_scale, theirs.embed_tokens(ids[None])[0])
        norms = [(layer.ln_attn_in, their_layer.input_layernorm),
                 (layer.ln_attn_out, their_layer.post_attention_layernorm),
                 (layer.ln_mlp_in, their_layer.pre_feedforward_layernorm),
                 (layer.ln_mlp_out, their_layer.post_feedforward_layernorm),
                 (ours.norm, theirs.norm)]  # fmt: skip
        for scale, module in norms:
            assert torch.equal(gemma_rms_norm(x, scale, ours.eps), module(x))
        their_q = their_layer.self_attn.q_norm(q.transpose(0, 1)).transpose(0, 1)
        assert torch.equal(gemma_rms_norm(q, layer.q_norm, ours.eps), their_q)


# EmbeddingGemma's sentence-transformers layout: mean pooling, Dense up (768 -> 3072) and
# down (3072 -> 768), both without bias or activation, then Normalize.
DENSE = ((64, 160), (160, 48))
IDENTITY = "torch.nn.modules.linear.Identity"
TEXTS = [
    "a",
    "the quick brown fox jumps over the lazy dog while the cat sleeps by the warm fire",
    "route this to billing please, it is urgent and has been waiting for a reply " * 3,
    "short text",
    "embeddings of long rows cross the sliding window of the tiny model many times " * 2,
]


def _dense_tensors(in_features: int, out_features: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(in_features * 1000 + out_features)
    return {"linear.weight": torch.randn(out_features, in_features, generator=generator) * 0.2}


@pytest.fixture(scope="module")
def embedding_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("embeddinggemma")
    write_reference(folder, _mixed())
    (folder / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": 64, "pooling_mode_cls_token": False,
               "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
               "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_lasttoken": False,
               "include_prompt": True}  # fmt: skip
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    kinds = [("", "Transformer"), ("1_Pooling", "Pooling")]
    for idx, (n_in, n_out) in enumerate(DENSE, start=2):
        path = folder / f"{idx}_Dense"
        path.mkdir()
        dense = {"in_features": n_in, "out_features": n_out, "bias": False,
                 "activation_function": IDENTITY}  # fmt: skip
        (path / "config.json").write_text(json.dumps(dense))
        save_file(_dense_tensors(n_in, n_out), str(path / "model.safetensors"))
        kinds.append((path.name, "Dense"))
    kinds.append((f"{len(kinds)}_Normalize", "Normalize"))
    (folder / kinds[-1][0]).mkdir()
    modules = [
        {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
        for i, (path, kind) in enumerate(kinds)
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    return folder


def test_embedding_folder_matches_the_module_math(embedding_folder):
    """transformers' hidden states, mean-pooled, through both Dense, L2-normalised."""
    model = load_model(embedding_folder)
    assert model.pooling_modes == ("mean",) and model.normalize
    assert model.embedding_dim == DENSE[-1][1]
    rows = random_rows(LENGTHS, seed=1)
    want = []
    for states in reference_hidden(embedding_folder, rows):
        x = states.mean(0)
        for n_in, n_out in DENSE:
            x = _dense_tensors(n_in, n_out)["linear.weight"] @ x
        want.append(x)
    want = F.normalize(torch.stack(want), dim=1)
    got = model.embed(rows)
    assert _max_diff(got, want) <= TOLERANCE
    for row, vector in zip(rows, got, strict=True):
        assert torch.equal(model.embed([row])[0], vector)


# sentence-transformers runs in a child process: importing it here would leave it in
# sys.modules for later tests (test_artifacts checks sr never imports it).
_ST_ENCODE = """
import sys, torch, sentence_transformers
folder, out, texts = sys.argv[1], sys.argv[2], sys.argv[3:]
model = sentence_transformers.SentenceTransformer(folder, device="cpu")
torch.save(model.encode(texts, convert_to_tensor=True).float(), out)
"""


def test_embedding_folder_matches_sentence_transformers(embedding_folder, tmp_path):
    # A test dependency (the test extra), run in a child: it is never imported here.
    assert importlib.util.find_spec("sentence_transformers") is not None, (
        "sentence-transformers is not installed (pip install -e '.[test]')"
    )
    out = tmp_path / "st.pt"
    done = subprocess.run(
        [sys.executable, "-c", _ST_ENCODE, str(embedding_folder), str(out), *TEXTS],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    want = torch.load(out)
    model = load_model(embedding_folder)
    ids = model.tokenize(TEXTS)
    assert max(len(row) for row in ids) > 3 * model.backbone.window
    got = model.embed(ids)
    assert got.shape == want.shape
    assert _max_diff(got, want) <= TOLERANCE


def test_sentence_transformers_folder_serves_the_bare_model_whatever_config_names(
    embedding_folder, tmp_path
):
    """Outside a sentence-transformers folder a class sr does not serve is refused; inside
    one the bare model is served, as sentence-transformers loads it."""
    folder = tmp_path / "named"
    shutil.copytree(embedding_folder, folder)
    _edit_config(folder, architectures=["Gemma3ForCausalLM"])
    rows = random_rows([9, 25], seed=6)
    assert torch.equal(load_model(folder).embed(rows), load_model(embedding_folder).embed(rows))
    (folder / "modules.json").unlink()
    with pytest.raises(UnsupportedModel, match="Gemma3ForCausalLM"):
        load_model(folder)


UNSUPPORTED = {
    "causal": ({"use_bidirectional_attention": False}, "causal Gemma3"),
    "no-bidirectional-key": ({"use_bidirectional_attention": _DROP}, "causal Gemma3"),
    "vision-only bidirectional": ({"use_bidirectional_attention": "vision"}, "'vision'"),
    "softcapping": ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    "activation": ({"hidden_activation": "gelu"}, "hidden_activation 'gelu'"),
    "rope_parameters": (
        {
            "rope_parameters": {
                FULL: {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                SLIDING: {"rope_type": "default", "rope_theta": 1e4},
            }
        },
        "linear",
    ),
    "rope_scaling": (
        {"rope_parameters": _DROP, "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
        "linear",
    ),
    "flat rope_parameters": (
        {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
        "one entry per layer type",
    ),
    "layer_types": ({"layer_types": [SLIDING, FULL, "chunked_attention", FULL]}, "layer_types"),
    "no window": ({"sliding_window": None}, "sliding_window None"),
}


@pytest.fixture(scope="module")
def plain_checkpoint(tmp_path_factory):
    return write_reference(tmp_path_factory.mktemp("plain"), _mixed())


@pytest.mark.parametrize("option", list(UNSUPPORTED))
def test_unsupported_options_are_refused_at_load_in_one_line(plain_checkpoint, tmp_path, option):
    edit, named = UNSUPPORTED[option]
    folder = tmp_path / "model"
    shutil.copytree(plain_checkpoint, folder)
    _edit_config(folder, **edit)
    with pytest.raises(UnsupportedModel, match=named) as refused:
        load_model(folder)
    assert "\n" not in str(refused.value)
