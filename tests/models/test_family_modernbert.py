"""ModernBERT against transformers on tiny random checkpoints (tests/models/reference.py):
hidden states and classifier logits (both `classifier_pooling` modes) within 1e-5 at
float32, each row bit-identical alone and packed, and its own features reached: rows
longer than the sliding window, global and local layers with different rotary thetas,
the configs written before `layer_types` / `rope_parameters` existed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers

from sr.errors import UnsupportedModel
from sr.models import load_model
from tests.models.reference import (
    VOCAB,
    assert_close_and_packing_invariant,
    random_rows,
    reference_hidden,
    reference_logits,
    sr_hidden,
    write_reference,
)

# local_attention=8 reaches 4 tokens each side: the rows of 17 and 40 tokens meet the
# window on local layers, the rows of 1, 3 and 5 tokens fit inside it. Equal lengths (5, 5)
# share an attention group.
LENGTHS = [1, 5, 5, 17, 40, 3, 17]  # the 17s apart (see test_families)
WINDOW = 8
TOLERANCE = 1e-5


def _config(**extra):
    # Three layers, global every second: layers 0 and 2 global, layer 1 local, each kind
    # with its own rotary theta. Special-token ids inside the vocabulary.
    return transformers.ModernBertConfig(
        vocab_size=VOCAB, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=40, max_position_embeddings=128, global_attn_every_n_layers=2,
        local_attention=WINDOW, global_rope_theta=1000.0, local_rope_theta=50.0,
        pad_token_id=0, bos_token_id=101, eos_token_id=102, cls_token_id=101,
        sep_token_id=102, **extra,
    )  # fmt: skip


# The defaults (no biases anywhere) and every optional bias on, with another activation.
VARIANTS = {
    "plain": {},
    "biased": dict(
        norm_bias=True,
        attention_bias=True,
        mlp_bias=True,
        classifier_bias=True,
        hidden_activation="gelu_pytorch_tanh",
        classifier_activation="silu",
    ),
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def reference(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"modernbert-{request.param}")
    write_reference(folder, _config(**VARIANTS[request.param]))
    rows = random_rows(LENGTHS)
    return folder, rows, reference_hidden(folder, rows)


def _max_diff(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max((g - w).abs().max().item() for g, w in zip(got, want, strict=True))


def test_hidden_states_match_transformers_and_rows_are_the_same_alone_and_packed(reference):
    folder, rows, expected = reference
    model = load_model(folder)
    assert_close_and_packing_invariant(model, rows, expected, TOLERANCE)


def test_window_and_layer_kinds_are_reached(reference):
    folder, rows, expected = reference
    model = load_model(folder)
    backbone = model.backbone
    assert [layer.window for layer in backbone.layers] == [False, True, False]
    assert not torch.equal(backbone.layers[0].rotary.cos, backbone.layers[1].rotary.cos)
    # Widen the window past every row: only the rows longer than it change, so the mask
    # is what the reference agreement above rests on.
    backbone.window = 1000
    unwindowed = sr_hidden(model, rows)
    for row, got, want in zip(rows, unwindowed, expected, strict=True):
        diff = (got - want).abs().max().item()
        if len(row) - 1 > WINDOW // 2:
            assert diff > 1e-3, f"row of {len(row)} tokens does not feel the window"
        else:
            assert diff <= TOLERANCE
    backbone.window = WINDOW
    # Swap the two kinds' thetas: every row longer than one token changes.
    global_rotary, local_rotary = backbone.layers[0].rotary, backbone.layers[1].rotary
    for layer in backbone.layers:
        layer.rotary = local_rotary if layer.rotary is global_rotary else global_rotary
    swapped = sr_hidden(model, rows)
    assert all(
        (g - w).abs().max().item() > 1e-3 for g, w in zip(swapped[1:], expected[1:], strict=True)
    )


def _copy_with_config(folder: Path, target: Path, **change) -> Path:
    """A copy of a checkpoint folder with config.json keys changed (None: removed)."""
    target.mkdir()
    for path in folder.iterdir():
        shutil.copyfile(path, target / path.name)
    config = json.loads((folder / "config.json").read_text())
    config.update(change)
    config = {key: value for key, value in config.items() if value is not None}
    (target / "config.json").write_text(json.dumps(config))
    return target


def test_config_without_layer_types_or_rope_parameters(reference, tmp_path):
    """Checkpoints saved before transformers 5 name the layout by global_attn_every_n_layers
    and global/local_rope_theta only."""
    folder, rows, expected = reference
    legacy = _copy_with_config(
        folder, tmp_path / "legacy", layer_types=None, rope_parameters=None,
        global_attn_every_n_layers=2, global_rope_theta=1000.0, local_rope_theta=50.0,
    )  # fmt: skip
    assert _max_diff(sr_hidden(load_model(legacy), rows), expected) <= TOLERANCE


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("labels", [3, 1])
def test_classifier_logits_match_transformers(tmp_path, variant, labels):
    # One checkpoint read with either pooling: the head's weights do not depend on it.
    written = write_reference(
        tmp_path / "written", _config(num_labels=labels, **VARIANTS[variant]), head=True
    )
    rows = random_rows(LENGTHS)
    for pooling in ("cls", "mean"):
        folder = _copy_with_config(written, tmp_path / pooling, classifier_pooling=pooling)
        model = load_model(folder)
        assert model.backbone.pooling == pooling
        assert model.head_labels is not None and len(model.head_labels) == labels
        got = model.classify_logits(rows)
        assert (got - reference_logits(folder, rows)).abs().max().item() <= TOLERANCE, pooling
        alone = torch.cat([model.classify_logits([row]) for row in rows])
        assert torch.equal(alone, got), pooling


@pytest.fixture(scope="module")
def head_checkpoint(tmp_path_factory):
    return write_reference(
        tmp_path_factory.mktemp("modernbert-head"), _config(num_labels=2), head=True
    )


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"hidden_activation": "gelu_new"}, "hidden_activation"),
        ({"classifier_activation": "gelu_new"}, "classifier_activation"),
        ({"classifier_pooling": "max"}, "classifier_pooling"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
        (
            {
                "rope_parameters": {
                    "full_attention": {"rope_type": "linear", "factor": 2.0},
                    "sliding_attention": {"rope_type": "default"},
                }
            },
            "rope_type",
        ),
        ({"layer_types": ["full_attention", "chunked_attention", "full_attention"]}, "layer_types"),
    ],
)
def test_unsupported_option_is_refused_at_load(head_checkpoint, tmp_path, change, named):
    folder = _copy_with_config(head_checkpoint, tmp_path / "changed", **change)
    with pytest.raises(UnsupportedModel, match=named):
        load_model(folder)
