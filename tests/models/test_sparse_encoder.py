"""SPLADE folders (sentence-transformers' SparseEncoder: MLMTransformer -> SpladePooling)
against SparseEncoder.encode itself, on tiny random masked-LM models that transformers
writes: max and sum pooling, both activations, top-k pruning (`max_active_dims`), and the
BERT, DistilBERT and RoBERTa heads. A row's vector is bit-identical alone and in a batch."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers

from sr.errors import UnsupportedModel
from sr.models import load_model
from sr.models.sparse import read_sparse_chain
from tests.models.reference import TOKENIZER_FILES, VOCAB
from tests.models.st_reference import encode, save_sparse_encoder

TOLERANCE = 1e-5
TEXTS = [
    "hello world",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "a",
    "SPLADE expands a query into the vocabulary terms it implies, weighted.",
]
_SMALL = dict(num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=130)
CONFIGS = {
    "bert": lambda: transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, **_SMALL
    ),
    "distilbert": lambda: transformers.DistilBertConfig(
        vocab_size=VOCAB, dim=32, hidden_dim=64, n_layers=2, n_heads=2, max_position_embeddings=130
    ),
    "roberta": lambda: transformers.RobertaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, **_SMALL
    ),
}


def write_mlm(folder, model_type: str, seed: int = 0):
    """A seeded random `*ForMaskedLM` saved by transformers, with the MiniLM tokenizer."""
    from sr.models.artifacts import embedded_default_dir

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = transformers.AutoModelForMaskedLM.from_config(CONFIGS[model_type]())
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.2)
    model.save_pretrained(folder, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (embedded_default_dir() / name).exists():
            shutil.copyfile(embedded_default_dir() / name, folder / name)
    return folder


def _sparse_folder(tmp_path_factory, model_type: str, **options):
    mlm = write_mlm(tmp_path_factory.mktemp(f"mlm-{model_type}"), model_type)
    out = tmp_path_factory.mktemp(f"splade-{model_type}") / "model"
    return save_sparse_encoder(mlm, out, **options)


@pytest.fixture(scope="module")
def bert_splade(tmp_path_factory):
    return _sparse_folder(tmp_path_factory, "bert", pooling="max", activation="relu")


CASES = [
    ("bert", {"pooling": "sum", "activation": "relu"}),
    ("bert", {"pooling": "max", "activation": "log1p_relu", "max_active_dims": 7}),
    ("distilbert", {"pooling": "max", "activation": "relu"}),
    ("roberta", {"pooling": "sum", "activation": "log1p_relu"}),
]


def _check_against_sentence_transformers(folder, work):
    (want,) = encode(folder, [{"texts": TEXTS}], sparse=True, work=work)
    model = load_model(folder)
    rows = model.tokenize(TEXTS)
    got = model.embed(rows)
    assert got.shape == want.shape == (len(TEXTS), VOCAB)
    assert float((got - want).abs().max()) <= TOLERANCE
    # The same non-zero entries (pruning and relu pick the same ones).
    assert torch.equal(got != 0, want != 0)
    for row, vector in zip(rows, got, strict=True):
        assert torch.equal(model.embed([row])[0], vector)  # alone == in the batch
    return model, got


def test_max_relu_matches_sparse_encoder(bert_splade, tmp_path):
    model, got = _check_against_sentence_transformers(bert_splade, tmp_path)
    assert model.sparse_head is not None and model.embedding_dim == VOCAB
    assert model.head_labels is None
    assert (got >= 0).all() and (got > 0).any()


@pytest.mark.parametrize(("model_type", "options"), CASES, ids=lambda c: str(c))
def test_pooling_activation_pruning_and_families(tmp_path_factory, tmp_path, model_type, options):
    folder = _sparse_folder(tmp_path_factory, model_type, **options)
    spec = read_sparse_chain(folder)
    assert (spec.pooling, spec.activation) == (options["pooling"], options["activation"])
    assert spec.max_active_dims == options.get("max_active_dims")
    _, got = _check_against_sentence_transformers(folder, tmp_path)
    if "max_active_dims" in options:
        assert int((got != 0).sum(1).max()) == options["max_active_dims"]


def _edit_json(path, **changes):
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_unsupported_sparse_folders_are_refused(bert_splade, tmp_path):
    folder = tmp_path / "bad"
    shutil.copytree(bert_splade, folder)
    pooling = folder / "1_SpladePooling" / "config.json"
    _edit_json(pooling, pooling_strategy="mean")
    with pytest.raises(UnsupportedModel, match="pooling_strategy 'mean'"):
        load_model(folder)
    _edit_json(pooling, pooling_strategy="max", activation_function="gelu")
    with pytest.raises(UnsupportedModel, match="activation_function 'gelu'"):
        load_model(folder)
    _edit_json(pooling, activation_function="relu")
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                    "type": "sentence_transformers.models.Normalize"})  # fmt: skip
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(UnsupportedModel, match="MLMTransformer -> SpladePooling"):
        load_model(folder)
