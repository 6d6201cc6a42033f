"""`engine: onnxruntime`: each family's backbone exported and run by ONNX Runtime answers what
the torch engine answers (within 1e-5) through the same pooling and heads, for rows of every
length the model takes, single texts and pairs; the graph is kept in the host cache and a
second load skips the export."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from sr.errors import UnsupportedModel
from sr.models.encoder import load_model
from sr.models.onnx_engine import OrtBackbone
from tests.models import (
    test_families,
    test_family_deberta,
    test_family_distilbert,
    test_family_gemma3,
    test_family_modernbert,
    test_family_mpnet,
    test_family_qwen3,
)
from tests.models.reference import random_rows, write_reference

# One checkpoint per family, as that family's own tests build it; (config, with a head).
CHECKPOINTS = {
    "bert": lambda: (test_families._bert(), False),
    "bert-head": lambda: (test_families._bert(num_labels=3), True),
    "roberta": lambda: (test_families._roberta(), False),
    "xlm-roberta": lambda: (test_families._xlm_roberta(), False),
    "distilbert": lambda: (test_family_distilbert.CONFIGS["gelu"](), False),
    "mpnet": lambda: (test_family_mpnet._mpnet(), False),
    "deberta-v3": lambda: (test_family_deberta._config("v3"), False),
    "modernbert": lambda: (test_family_modernbert._config(), False),
    "qwen3": lambda: (test_family_qwen3.CONFIGS["gqa4"](), False),
    "gemma3": lambda: (test_family_gemma3.CONFIGS["mixed"](), False),
}


@pytest.fixture(scope="module", params=list(CHECKPOINTS))
def checkpoint(request, tmp_path_factory):
    config, head = CHECKPOINTS[request.param]()
    folder = write_reference(tmp_path_factory.mktemp(request.param), config, head=head)
    return request.param, folder, config


def _lengths(config: transformers.PretrainedConfig) -> list[int]:
    limit = config.max_position_embeddings
    return [n for n in (1, 4, 9, 33, 70, 127) if n <= limit]


def test_every_family_answers_as_the_torch_engine(checkpoint):
    name, folder, config = checkpoint
    torch_model = load_model(folder)
    ort_model = load_model(folder, engine="onnxruntime")
    assert isinstance(ort_model.backbone, OrtBackbone)
    card = ort_model.engine_card
    assert card["name"] == "onnxruntime" and card["graph"] in ("fused", "plain"), card
    assert card["export"] == "exported" and card["max_difference"] <= 1e-4, card
    rows = random_rows(_lengths(config))
    if torch_model.head_labels is not None:
        want, got = torch_model.classify_logits(rows), ort_model.classify_logits(rows)
    else:
        want, got = torch_model.embed(rows), ort_model.embed(rows)
    # the engine's own rule: within 1e-5 of the largest magnitude (Gemma3's answers reach 2.6)
    scale = max(1.0, want.abs().max().item())
    assert (got - want).abs().max().item() <= 1e-5 * scale, (name, scale)
    # a row's answer does not depend on the rows beside it: each is one ORT run
    alone = torch.cat([ort_model.embed([row]) for row in rows])
    assert torch.equal(alone, ort_model.embed(rows))


def test_a_pair_keeps_its_second_text_token_type(tmp_path):
    """A BERT cross-encoder types a pair's second text 1: the exported graph takes the types."""
    folder = write_reference(tmp_path, test_families._bert(num_labels=1), head=True)
    torch_model, ort_model = load_model(folder), load_model(folder, engine="onnxruntime")
    pairs = torch_model.encode_pairs("a query", ["first document", "a second, longer document"])
    rows, starts = [ids for ids, _ in pairs], [start for _, start in pairs]
    want = torch_model.rerank_logits(rows, starts)
    got = ort_model.rerank_logits(rows, starts)
    assert (got - want).abs().max().item() <= 1e-5
    # and the types matter: the same ids typed as one text answer otherwise
    assert (ort_model.classify_logits(rows) - got).abs().max().item() > 1e-4


def test_the_graph_is_kept_and_a_second_load_reads_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SR_CACHE_DIR", str(tmp_path / "cache"))
    folder = write_reference(tmp_path / "bert", test_families._bert())
    first = load_model(folder, engine="onnxruntime")
    kept = sorted((tmp_path / "cache" / "onnx").iterdir())
    assert [p.suffix for p in kept] == [".json", ".onnx"]
    assert json.loads(kept[0].read_text())["graph"] == first.engine_card["graph"]
    second = load_model(folder, engine="onnxruntime")
    assert second.engine_card["export"] == "cached"
    rows = random_rows([5, 12])
    assert torch.equal(first.embed(rows), second.embed(rows))


def test_with_the_cache_off_the_graph_is_held_in_memory_and_nothing_is_left(tmp_path, monkeypatch):
    monkeypatch.setenv("SR_CACHE_DIR", "off")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    folder = write_reference(tmp_path / "bert", test_families._bert())
    model = load_model(folder, engine="onnxruntime")
    assert isinstance(model.backbone.exported.model, bytes)
    rows = random_rows([3, 30])
    assert (model.embed(rows) - load_model(folder).embed(rows)).abs().max().item() <= 1e-5
    assert [p for p in (tmp_path / "tmp").iterdir() if p.name.startswith("sr-onnx-")] == []


def test_embeddings_pool_ort_rows_with_no_torch_operator(tmp_path, monkeypatch):
    """The embedding path takes ORT's numpy rows to numpy pooling: neither the torch-facing
    `hidden_states` nor torch's pooling runs, and the answer is the torch engine's."""
    folder = write_reference(tmp_path / "bert", test_families._bert())
    model = load_model(folder, engine="onnxruntime")

    def torch_path(*args, **kwargs):
        raise AssertionError("the embedding path went through torch")

    monkeypatch.setattr(model.backbone, "hidden_states", torch_path)
    monkeypatch.setattr("sr.models.encoder.pool", torch_path)
    rows = random_rows([1, 7, 40])
    got = model.embed(rows)
    monkeypatch.undo()
    want = load_model(folder).embed(rows)
    assert got.dtype == torch.float32 and (got - want).abs().max().item() <= 1e-5
    with pytest.raises(ValueError, match="token ids"):  # the limits still hold on this path
        model.embed([[0, 10**6]])


def test_without_onnxruntime_the_engine_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "onnxruntime" else real(name, *a),
    )
    with pytest.raises(UnsupportedModel, match=r"sr\[onnx\]"):
        load_model(tmp_path, engine="onnxruntime")


def test_onnxruntime_serves_float32_on_the_cpu_only(tiny_model_dir):
    with pytest.raises(UnsupportedModel, match="float32"):
        load_model(tiny_model_dir, dtype="bfloat16", engine="onnxruntime")
