"""DistilBERT against transformers on tiny random checkpoints that transformers itself wrote
(tests/models/reference.py): hidden states, sequence logits (1 and 3 labels) and token
logits within 1e-5 at float32 with the GELU and the ReLU feed-forward and with sinusoidal
position embeddings; each row bit-identical alone and packed, on each kernel; the head
config.json's `architectures` names is the one served; unsupported options refused at load
in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from sr.errors import UnsupportedModel
from sr.models import load_model
from sr.models.artifacts import embedded_default_dir
from sr.models.limits import token_limits
from sr.models.testing import write_sentence_transformers_modules
from tests.models.reference import (
    TOKENIZER_FILES,
    VOCAB,
    assert_close_and_packing_invariant,
    random_rows,
    reference_hidden,
    reference_logits,
    sr_hidden,
)
from tests.models.token_models import reference_model as reference_token_model

LENGTHS = [1, 5, 5, 17, 40, 3, 17]  # the 17s apart (see test_families)
TOLERANCE = 1e-5
POSITIONS = 128
HIDDEN = 48


def _distilbert(**extra):
    return transformers.DistilBertConfig(
        vocab_size=VOCAB, dim=HIDDEN, n_layers=2, n_heads=4, hidden_dim=96,
        max_position_embeddings=POSITIONS, **extra,
    )  # fmt: skip


CONFIGS = {
    "gelu": lambda **extra: _distilbert(activation="gelu", **extra),
    "relu": lambda **extra: _distilbert(activation="relu", **extra),
    "sinusoidal": lambda **extra: _distilbert(sinusoidal_pos_embds=True, **extra),
}
KINDS = {
    "bare": "AutoModel",
    "sequence": "AutoModelForSequenceClassification",
    "token": "AutoModelForTokenClassification",
    "masked-lm": "AutoModelForMaskedLM",
}


def write_distilbert(folder: Path, config, kind: str = "bare", *, seed: int = 0) -> Path:
    """A seeded random DistilBERT of `kind` saved by transformers, with the MiniLM
    tokenizer. Every weight random (not the init's near-zero values), LayerNorms near 1,
    except a sinusoidal position table, which keeps transformers' own values."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = getattr(transformers, KINDS[kind]).from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if config.sinusoidal_pos_embds and "position_embeddings" in name:
                continue
            parameter.copy_(torch.randn_like(parameter) * 0.2)
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.copy_(1.0 + torch.randn_like(module.weight) * 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    source = embedded_default_dir()
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copyfile(source / name, folder / name)
    return folder


def _edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


@pytest.fixture(scope="module", params=list(CONFIGS))
def base(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"distilbert-{request.param}")
    return request.param, write_distilbert(folder, CONFIGS[request.param]())


# -- against transformers --------------------------------------------------------------------
def test_hidden_states_match_transformers_and_rows_are_the_same_alone_and_packed(base):
    _, folder = base
    model = load_model(folder)
    assert model.max_position_embeddings == POSITIONS  # positions from 0, no reserved ids
    assert model.backbone.hidden_size == HIDDEN and model.head_task is None
    rows = random_rows(LENGTHS)
    expected = reference_hidden(folder, rows)
    assert_close_and_packing_invariant(model, rows, expected, TOLERANCE)


def test_limits_come_from_max_position_embeddings(base):
    _, folder = base
    limits = token_limits(folder)
    assert (limits.default, limits.ceiling) == (POSITIONS, POSITIONS)


def test_the_sinusoidal_table_is_a_stored_weight_transformers_reads_back(tmp_path):
    """transformers saves the sinusoidal table like any weight and uses the stored one at
    load (here: a table that is not sinusoidal at all), so sr needs nothing special."""
    from transformers.models.distilbert.modeling_distilbert import (
        _create_sinusoidal_embeddings,
    )

    folder = write_distilbert(tmp_path / "model", CONFIGS["sinusoidal"]())
    weights = load_file(str(folder / "model.safetensors"))
    table = weights["embeddings.position_embeddings.weight"]
    want = _create_sinusoidal_embeddings(POSITIONS, HIDDEN, torch.empty(POSITIONS, HIDDEN))
    assert torch.equal(table, want)
    weights["embeddings.position_embeddings.weight"] = torch.randn_like(table)
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    rows = random_rows(LENGTHS)
    assert_close_and_packing_invariant(
        load_model(folder), rows, reference_hidden(folder, rows), TOLERANCE
    )


@pytest.mark.parametrize("name", ["gelu", "relu"])
@pytest.mark.parametrize("labels", [3, 1])
def test_sequence_logits_match_transformers(tmp_path, name, labels):
    folder = write_distilbert(tmp_path, CONFIGS[name](num_labels=labels), "sequence")
    model = load_model(folder)
    assert model.head_task == "sequence" and model.head_labels is not None
    assert len(model.head_labels) == labels
    rows = random_rows(LENGTHS)
    got = model.classify_logits(rows)
    want = reference_logits(folder, rows)
    assert got.shape == want.shape == (len(rows), labels)
    assert (got - want).abs().max().item() <= TOLERANCE
    for index, row in enumerate(rows):
        assert torch.equal(model.classify_logits([row])[0], got[index]), f"row {index}"


@pytest.mark.parametrize("name", ["gelu", "relu"])
def test_token_logits_match_transformers_and_rows_are_the_same_alone_and_packed(tmp_path, name):
    folder = write_distilbert(tmp_path, CONFIGS[name](num_labels=5), "token")
    model = load_model(folder)
    assert model.head_task == "token" and model.head_activation == "softmax"
    assert model.head_labels == [f"LABEL_{i}" for i in range(5)]
    reference = reference_token_model(folder)
    rows = random_rows(LENGTHS)
    packed = model.token_logits(rows)
    assert packed.dtype == torch.float32 and packed.shape == (sum(map(len, rows)), 5)
    start = 0
    for row in rows:
        got = packed[start : start + len(row)]
        start += len(row)
        with torch.no_grad():
            want = reference(input_ids=torch.tensor([row])).logits[0]
        assert (got - want).abs().max().item() <= TOLERANCE, f"row of {len(row)} tokens"
        assert torch.equal(model.token_logits([row]), got), f"row of {len(row)} tokens"


def test_a_sentence_transformers_folder_embeds_with_the_bare_model(tmp_path):
    """DistilBERT embedders (msmarco-distilbert-*, multi-qa-distilbert-*) in a
    sentence-transformers folder: the bare model, mean-pooled and normalised, whatever
    class config.json names (here the masked-LM one saved with it)."""
    folder = write_distilbert(tmp_path / "st", CONFIGS["gelu"](), "masked-lm")
    assert json.loads((folder / "config.json").read_text())["architectures"] == [
        "DistilBertForMaskedLM"
    ]
    with pytest.raises(UnsupportedModel, match="DistilBertForMaskedLM"):
        load_model(folder)
    write_sentence_transformers_modules(folder, HIDDEN, POSITIONS)
    model = load_model(folder)
    assert model.head_task is None
    rows = random_rows(LENGTHS)
    reference = transformers.AutoModel.from_pretrained(folder, attn_implementation="eager")
    with torch.no_grad():
        states = [reference(input_ids=torch.tensor([row])).last_hidden_state[0] for row in rows]
    want = torch.nn.functional.normalize(torch.stack([s.mean(0) for s in states]), dim=-1)
    assert (model.embed(rows) - want).abs().max().item() <= TOLERANCE


def test_a_pair_has_no_second_token_type(tmp_path):
    """transformers' DistilBERT takes no token types: a pair's second text embeds as the
    same tokens would alone."""
    from sr.models.blocks import Packed

    folder = write_distilbert(tmp_path / "model", CONFIGS["gelu"]())
    backbone = load_model(folder).backbone
    rows = random_rows([9, 12])
    ids = torch.tensor([t for row in rows for t in row])
    with torch.inference_mode():
        plain = backbone.hidden_states(ids, Packed([9, 12]))
        pairs = backbone.hidden_states(ids, Packed([9, 12], second_starts=[4, 6]))
    assert torch.equal(plain, pairs)


# -- bits on each kernel ---------------------------------------------------------------------
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kernel", ["blas", "onednn"])
@pytest.mark.parametrize("name", ["gelu", "relu"])
def test_rows_are_the_same_alone_and_packed_on_each_kernel(tmp_path, name, kernel, threads):
    folder = write_distilbert(tmp_path, CONFIGS[name](num_labels=1), "sequence")
    try:
        model = load_model(folder, kernel=kernel)
    except ValueError as error:  # oneDNN unavailable on this host
        pytest.skip(f"oneDNN is not available on this host: {error}")
    assert model.kernel_card["linear"] == kernel
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for length in range(1, 41, 3):
            rows = random_rows([length, 9, length, 60, length], seed=length)
            logits = model.classify_logits(rows)
            for index, (row, got) in enumerate(zip(rows, sr_hidden(model, rows), strict=True)):
                what = f"{len(row)} tokens, {kernel}, {threads} threads"
                (alone,) = sr_hidden(model, [row])
                assert torch.equal(alone, got), what
                assert torch.equal(model.classify_logits([row])[0], logits[index]), what
    finally:
        torch.set_num_threads(before)


# -- what is served, what is refused ---------------------------------------------------------
def test_architectures_name_the_head_and_without_them_the_tensors_do(tmp_path):
    token = write_distilbert(tmp_path / "token", CONFIGS["gelu"](num_labels=4), "token")
    sequence = write_distilbert(tmp_path / "seq", CONFIGS["gelu"](num_labels=2), "sequence")
    _edit_config(token, architectures=["DistilBertModel"])
    model = load_model(token)
    assert model.head_task is None and model.head_labels is None
    # No `architectures`: `pre_classifier` marks the sequence head, `classifier` alone the
    # token head (as among transformers' DistilBERT classes).
    _edit_config(token, architectures=None)
    assert load_model(token).head_task == "token"
    _edit_config(sequence, architectures=None)
    assert load_model(sequence).head_task == "sequence"
    # A sequence head named as a token head is served as one: its `classifier` per token.
    _edit_config(sequence, architectures=["DistilBertForTokenClassification"])
    assert load_model(sequence).head_task == "token"


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"activation": "gelu_new"}, "activation 'gelu_new' is not supported"),
        ({"activation": "silu"}, "activation 'silu' is not supported"),
        ({"n_heads": 5}, "not a multiple"),
        ({"architectures": ["DistilBertForQuestionAnswering"]}, "DistilBertForQuestionAnswering"),
        ({"architectures": ["DistilBertForMaskedLM"]}, "DistilBertForTokenClassification"),
    ],
)
def test_unsupported_options_are_refused_at_load_in_one_line(tmp_path, changes, needle):
    folder = write_distilbert(tmp_path / "model", CONFIGS["gelu"]())
    _edit_config(folder, **changes)
    with pytest.raises(UnsupportedModel) as raised:
        load_model(folder)
    message = str(raised.value)
    assert needle in message and "\n" not in message


def test_a_file_without_its_position_table_is_refused(tmp_path):
    """transformers would recompute a sinusoidal table missing from the file (and draw a
    learnt one at random): sr refuses either, naming the tensor."""
    folder = write_distilbert(tmp_path / "model", CONFIGS["sinusoidal"]())
    weights = load_file(str(folder / "model.safetensors"))
    del weights["embeddings.position_embeddings.weight"]
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UnsupportedModel) as raised:
        load_model(folder)
    message = str(raised.value)
    assert "embeddings.position_embeddings.weight" in message and "\n" not in message
