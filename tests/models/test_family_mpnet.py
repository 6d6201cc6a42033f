"""MPNet against transformers on tiny random checkpoints (tests/models/reference.py): hidden
states and classifier logits within 1e-5 at float32, each row bit-identical alone and
packed, the relative position buckets exactly transformers', and unsupported options
refused at load."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers

from sr.errors import UnsupportedModel
from sr.models import load_model
from sr.models.mpnet import NUM_BUCKETS, relative_buckets
from tests.models.reference import (
    VOCAB,
    assert_close_and_packing_invariant,
    random_rows,
    reference_hidden,
    reference_logits,
    write_reference,
)

# Equal lengths (5, 5) share an attention group. The rows of 40 and 150 tokens reach past
# the 16 exact buckets into the log-spaced ones; 150 reaches the last bucket of each
# direction, which takes every offset of 128 tokens or more.
LENGTHS = [1, 5, 5, 17, 40, 150, 3, 17]  # the 17s apart (see test_families)
TOLERANCE = 1e-5


def _mpnet(**extra):
    return transformers.MPNetConfig(
        vocab_size=VOCAB, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=96, max_position_embeddings=160, **extra,
    )  # fmt: skip


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return write_reference(tmp_path_factory.mktemp("mpnet"), _mpnet())


def test_hidden_states_match_transformers_and_rows_are_the_same_alone_and_packed(base):
    model = load_model(base)
    assert model.max_position_embeddings == 158  # 160 less the two ids below the first
    rows = random_rows(LENGTHS)
    expected = reference_hidden(base, rows)
    assert_close_and_packing_invariant(model, rows, expected, TOLERANCE)


@pytest.mark.parametrize("labels", [3, 1])
def test_classifier_logits_match_transformers(tmp_path, labels):
    folder = write_reference(tmp_path, _mpnet(num_labels=labels), head=True)
    model = load_model(folder)
    rows = random_rows(LENGTHS)
    assert model.head_labels is not None and len(model.head_labels) == labels
    got = model.classify_logits(rows)
    want = reference_logits(folder, rows)
    assert got.shape == want.shape
    assert (got - want).abs().max().item() <= TOLERANCE


def test_relative_buckets_are_transformers_and_the_rows_reach_every_bucket():
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    positions = 600  # past MAX_DISTANCE, to the clamped far buckets
    offsets = torch.arange(-(positions - 1), positions)
    # transformers takes `key - query`; sr indexes by `query - key`.
    want = MPNetEncoder.relative_position_bucket(-offsets)
    assert torch.equal(relative_buckets(positions), want)
    # The longest test row sees offsets up to 149 both ways: every bucket, the far
    # log-spaced ones included, enters the comparison with transformers above. Bucket 16
    # (offset 0 among keys after the query) is the one no offset maps to.
    longest = max(LENGTHS)
    reached = set(relative_buckets(longest).tolist())
    assert reached == set(range(NUM_BUCKETS)) - {NUM_BUCKETS // 2}


def test_position_bias_mask_is_the_bucketed_table(base):
    model = load_model(base).backbone
    length = 150
    mask = model.position_bias(length)
    table = model.offset_bias  # [heads, 2P - 1]
    assert mask.shape == (model.num_heads, length, length)
    # Query 149 against key 0 is 149 tokens before: bucket 15 (the farthest, key before).
    buckets = relative_buckets(model.max_positions)
    assert buckets[149 + model.max_positions - 1] == 15
    assert torch.equal(mask[:, 149, 0], table[:, 149 + model.max_positions - 1])
    assert torch.equal(mask[:, 0, 149], table[:, -149 + model.max_positions - 1])


@pytest.mark.parametrize(
    ("option", "value"),
    [("hidden_act", "relu"), ("relative_attention_num_buckets", 64)],
)
def test_unsupported_options_are_refused_at_load(base, tmp_path, option, value):
    folder = tmp_path / "model"
    shutil.copytree(base, folder)
    config = json.loads((folder / "config.json").read_text())
    config[option] = value
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModel, match=option):
        load_model(folder)
