import json
import time

import torch

from sr.models import load_model
from sr.models.testing import TINY_HIDDEN, write_tiny_bert


def test_tiny_model_loads_fast_and_embeds(tiny_model_dir):
    started = time.perf_counter()
    model = load_model(tiny_model_dir)
    assert time.perf_counter() - started < 1.0
    assert model.embedding_dim == TINY_HIDDEN
    assert model.max_position_embeddings == 128
    assert model.head_labels is None
    vectors = model.embed(model.tokenize(["hello world", "a second, longer sentence"]))
    assert vectors.shape == (2, TINY_HIDDEN)
    assert vectors.dtype == torch.float32
    assert torch.allclose(vectors.norm(dim=1), torch.ones(2), atol=1e-6)
    assert not torch.allclose(vectors[0], vectors[1], atol=1e-3)


def test_tiny_head_model_has_labels(tiny_head_model_dir):
    model = load_model(tiny_head_model_dir)
    assert model.head_labels == ["negative", "neutral", "positive"]
    logits = model.classify_logits(model.tokenize(["good", "bad movie", "ok"]))
    assert logits.shape == (3, 3)


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    a = write_tiny_bert(tmp_path / "a", seed=7)
    b = write_tiny_bert(tmp_path / "b", seed=7)
    c = write_tiny_bert(tmp_path / "c", seed=8)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    assert json.loads((a / "config.json").read_text())["model_type"] == "bert"
