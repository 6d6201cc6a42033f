"""One real `sr serve` with two deployments, an embedder (the embedded MiniLM) and a
cross-encoder (a tiny BERT with one relevance output), and the transformers references the
client tests check its numbers against: MiniLM's mean pooling (and Normalize) and the
cross-encoder's logit."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
import transformers

from sr.models.artifacts import EMBEDDED_DEFAULT, embedded_default_dir
from sr.models.testing import write_tiny_bert
from tests.serve_process import ServeProcess

# What the client tests send: texts to embed, and a query with documents to rerank.
TEXTS = ["hello world", "The invoice was sent by mail on Tuesday."]
QUERY = "where is my invoice"
DOCUMENTS = ["the invoice was sent by mail", "hello there", "invoices are listed under billing"]


def serving_two_deployments(tmp_path_factory) -> Iterator[ServeProcess]:
    """A module fixture's body: `embedder` and `reranker` served at once; the process's
    `folder` is the cross-encoder's checkpoint."""
    folder = write_tiny_bert(
        tmp_path_factory.mktemp("models") / "cross-encoder", seed=5, with_head=True,
        labels=["score"],
    )  # fmt: skip
    config = {
        "global": {
            "model_catalog": {
                "deployments": {
                    "embedder": {"artifact": EMBEDDED_DEFAULT, "replicas": [{"device": "cpu"}]},
                    "reranker": {"artifact": str(folder), "replicas": [{"device": "cpu"}]},
                },
                "system": {"decision_model": {"deployment": "embedder"}},
            }
        },
        "listeners": [{"host": "127.0.0.1", "port": 8899, "api_keys": []}],
    }
    process = ServeProcess(tmp_path_factory.mktemp("two-deployments"), config)
    process.folder = folder
    process.start(timeout_s=90)
    try:
        yield process
    finally:
        process.stop()


def minilm_vectors() -> Callable[..., np.ndarray]:
    """MiniLM's sentence-transformers chain by transformers: mean pooling, then Normalize
    (`normalize=False`: the pooled vector before it)."""
    folder = str(embedded_default_dir())
    model = transformers.AutoModel.from_pretrained(folder).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)

    def embed(texts: list[str], normalize: bool = True) -> np.ndarray:
        batch = tokenizer(texts, padding=True, return_tensors="pt")
        with torch.no_grad():
            hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        pooled = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
        if not normalize:
            return pooled
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    return embed


def cross_encoder_logits(folder: Path) -> Callable[[list[tuple[str, str]]], list[float]]:
    """The cross-encoder's relevance logit of each (text, text_pair), by transformers."""
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(folder))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))

    def of(pairs: list[tuple[str, str]]) -> list[float]:
        first, second = zip(*pairs, strict=True)
        batch = tokenizer(list(first), list(second), padding=True, return_tensors="pt")
        with torch.no_grad():
            return model(**batch).logits[:, 0].tolist()

    return of


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))
