"""Every family against transformers on tiny random checkpoints (tests/models/reference.py):
hidden states and classifier logits within 1e-5 at float32, and each row bit-identical
alone and packed with rows of other lengths."""

from __future__ import annotations

import pytest
import transformers

from sr.models import load_model
from tests.models.reference import (
    VOCAB,
    assert_close_and_packing_invariant,
    random_rows,
    reference_hidden,
    reference_logits,
    write_reference,
)

# Equal lengths share an attention group, gathered into one tensor: the 5s side by side,
# the 17s with other rows between them; the other lengths attend alone.
LENGTHS = [1, 5, 5, 17, 40, 3, 17]
TOLERANCE = 1e-5


def _bert(**extra):
    return transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=96, max_position_embeddings=128, **extra,
    )  # fmt: skip


def _roberta(**extra):
    return transformers.RobertaConfig(
        vocab_size=VOCAB, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=96, max_position_embeddings=130, pad_token_id=1, **extra,
    )  # fmt: skip


def _xlm_roberta(**extra):
    return transformers.XLMRobertaConfig(
        vocab_size=VOCAB, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=96, max_position_embeddings=130, pad_token_id=1, **extra,
    )  # fmt: skip


CONFIGS = {"bert": _bert, "roberta": _roberta, "xlm-roberta": _xlm_roberta}


@pytest.fixture(scope="module", params=list(CONFIGS))
def family(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    write_reference(folder, CONFIGS[request.param]())
    return request.param, folder


def test_hidden_states_match_transformers_and_rows_are_the_same_alone_and_packed(family):
    _, folder = family
    model = load_model(folder)
    rows = random_rows(LENGTHS)
    expected = reference_hidden(folder, rows)
    assert_close_and_packing_invariant(model, rows, expected, TOLERANCE)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("labels", [3, 1])
def test_classifier_logits_match_transformers(tmp_path, name, labels):
    folder = write_reference(tmp_path, CONFIGS[name](num_labels=labels), head=True)
    model = load_model(folder)
    rows = random_rows(LENGTHS)
    assert model.head_labels is not None and len(model.head_labels) == labels
    got = model.classify_logits(rows)
    want = reference_logits(folder, rows)
    assert (got - want).abs().max().item() <= TOLERANCE
