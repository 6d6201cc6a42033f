"""A seeded-random tiny BERT checkpoint for fast tests.

The weights are random but the tokenizer is the real one of the embedded MiniLM, so texts
tokenize exactly as in production and the vocabulary (30522) stays valid. The folder has the
same layout as a sentence-transformers release: config.json, model.safetensors,
tokenizer.json, modules.json (Transformer -> mean Pooling -> Normalize).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from sr.models.artifacts import embedded_default_dir

TINY_HIDDEN = 32
TINY_LAYERS = 2
TINY_HEADS = 2
TINY_INTERMEDIATE = 64
TINY_MAX_POSITIONS = 128
TINY_VOCAB = 30522
DEFAULT_LABELS = ("negative", "neutral", "positive")

# Copied from the embedded model so tokenization is the production one.
_TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


def _tiny_config(*, with_head: bool, labels: list[str]) -> dict:
    config = {
        "architectures": ["BertForSequenceClassification" if with_head else "BertModel"],
        "model_type": "bert",
        "hidden_act": "gelu",
        "hidden_size": TINY_HIDDEN,
        "intermediate_size": TINY_INTERMEDIATE,
        "num_attention_heads": TINY_HEADS,
        "num_hidden_layers": TINY_LAYERS,
        "max_position_embeddings": TINY_MAX_POSITIONS,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "type_vocab_size": 2,
        "vocab_size": TINY_VOCAB,
    }
    if with_head:
        config["id2label"] = {str(i): label for i, label in enumerate(labels)}
        config["label2id"] = {label: i for i, label in enumerate(labels)}
    return config


def _tiny_weights(generator: torch.Generator, *, with_head: bool, num_labels: int) -> dict:
    def normal(*shape: int, std: float = 0.2) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * std

    def norm_pair(prefix: str) -> dict:
        # Not exactly ones/zeros so that a LayerNorm weight mix-up shows in the outputs.
        return {
            f"{prefix}.weight": 1.0 + normal(TINY_HIDDEN, std=0.1),
            f"{prefix}.bias": normal(TINY_HIDDEN, std=0.1),
        }

    h, i = TINY_HIDDEN, TINY_INTERMEDIATE
    weights = {
        "embeddings.word_embeddings.weight": normal(TINY_VOCAB, h, std=0.5),
        "embeddings.position_embeddings.weight": normal(TINY_MAX_POSITIONS, h, std=0.5),
        "embeddings.token_type_embeddings.weight": normal(2, h, std=0.5),
        **norm_pair("embeddings.LayerNorm"),
    }
    for layer in range(TINY_LAYERS):
        p = f"encoder.layer.{layer}"
        for name in ("query", "key", "value"):
            weights[f"{p}.attention.self.{name}.weight"] = normal(h, h)
            weights[f"{p}.attention.self.{name}.bias"] = normal(h, std=0.05)
        weights[f"{p}.attention.output.dense.weight"] = normal(h, h)
        weights[f"{p}.attention.output.dense.bias"] = normal(h, std=0.05)
        weights.update(norm_pair(f"{p}.attention.output.LayerNorm"))
        weights[f"{p}.intermediate.dense.weight"] = normal(i, h)
        weights[f"{p}.intermediate.dense.bias"] = normal(i, std=0.05)
        weights[f"{p}.output.dense.weight"] = normal(h, i)
        weights[f"{p}.output.dense.bias"] = normal(h, std=0.05)
        weights.update(norm_pair(f"{p}.output.LayerNorm"))
    if with_head:
        # BertForSequenceClassification layout: encoder under "bert.", pooler + classifier.
        weights = {f"bert.{k}": v for k, v in weights.items()}
        weights["bert.pooler.dense.weight"] = normal(h, h)
        weights["bert.pooler.dense.bias"] = normal(h, std=0.05)
        weights["classifier.weight"] = normal(num_labels, h, std=1.0)
        weights["classifier.bias"] = normal(num_labels, std=0.1)
    return {k: v.contiguous() for k, v in weights.items()}


def write_tiny_bert(
    folder: Path, *, seed: int = 0, with_head: bool = False, labels: list[str] | None = None
) -> Path:
    """Write a tiny seeded-random BERT checkpoint into `folder` and return the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    labels = list(labels) if labels is not None else list(DEFAULT_LABELS)
    if with_head and not labels:
        raise ValueError("a classification head needs at least one label")

    generator = torch.Generator().manual_seed(seed)
    weights = _tiny_weights(generator, with_head=with_head, num_labels=len(labels))
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})

    config = _tiny_config(with_head=with_head, labels=labels)
    (folder / "config.json").write_text(json.dumps(config, indent=2))

    source = embedded_default_dir()
    for name in _TOKENIZER_FILES:
        shutil.copyfile(source / name, folder / name)

    write_sentence_transformers_modules(folder, TINY_HIDDEN, TINY_MAX_POSITIONS)
    return folder


def write_sentence_transformers_modules(
    folder: Path, hidden: int, max_seq_length: int, *, pooling: str = "mean", normalize: bool = True
) -> None:
    """modules.json (Transformer -> Pooling -> [Normalize]), the Pooling config with one
    mode (`cls`, `mean` or `lasttoken`) and sentence_bert_config.json, as
    sentence-transformers saves them."""
    folder = Path(folder)
    kinds = ["Transformer", "Pooling"] + (["Normalize"] if normalize else [])
    paths = ["", "1_Pooling", "2_Normalize"]
    modules = [
        {"idx": i, "name": str(i), "path": paths[i], "type": f"sentence_transformers.models.{kind}"}
        for i, kind in enumerate(kinds)
    ]
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    for module in modules[1:]:
        (folder / module["path"]).mkdir(exist_ok=True)
    config = {
        "word_embedding_dimension": hidden,
        "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": pooling == "lasttoken",
        "include_prompt": True,
    }
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(config, indent=2))
    sbert = {"max_seq_length": max_seq_length, "do_lower_case": False}
    (folder / "sentence_bert_config.json").write_text(json.dumps(sbert, indent=2))
