"""SPLADE sparse embeddings: the head and pooling of a SparseEncoder folder
(sr.models.sparse reads its settings).

A row's vector has one value per vocabulary entry: the masked-language-model head's logits
of each of its tokens, through `log1p(relu(x))` (twice `log1p` for the `log1p_relu`
activation), pooled over the row's tokens by `max` or `sum`; with `max_active_dims`
(config_sentence_transformers.json) only that many of the largest values are kept, as
`SparseEncoder.encode` keeps them. Each row goes through the head alone, over exactly its
own tokens, so its answer does not depend on the other rows of its batch.

The head is the family's own masked-LM head (`*ForMaskedLM`): dense -> GELU -> LayerNorm ->
decoder (tied to the word embeddings when the file has no decoder weight) + bias, computed
in float32 whatever dtype the backbone computes in.
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F

from sr.errors import UnsupportedModel
from sr.models.sparse import SparseSpec


# Per family: the masked-LM head's tensor names (transform dense, its LayerNorm, decoder,
# decoder bias candidates, tied word embeddings candidates) and the LayerNorm epsilon key.
@attrs.frozen
class _HeadNames:
    dense: str
    norm: str
    decoder: str
    biases: tuple[str, ...]
    words: tuple[str, ...]
    eps_key: str | None  # None: 1e-12 (DistilBERT's fixed epsilon)
    activation_key: str | None  # None: always GELU (RoBERTa's lm_head)


_BERT = _HeadNames(
    "cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
    "cls.predictions.decoder", ("cls.predictions.bias", "cls.predictions.decoder.bias"),
    ("bert.embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
    "layer_norm_eps", "hidden_act",
)  # fmt: skip
_ROBERTA = _HeadNames(
    "lm_head.dense", "lm_head.layer_norm", "lm_head.decoder",
    ("lm_head.bias", "lm_head.decoder.bias"),
    ("roberta.embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
    "layer_norm_eps", None,
)  # fmt: skip
_DISTILBERT = _HeadNames(
    "vocab_transform", "vocab_layer_norm", "vocab_projector", ("vocab_projector.bias",),
    ("distilbert.embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
    None, "activation",
)  # fmt: skip
_HEADS = {"bert": _BERT, "roberta": _ROBERTA, "xlm-roberta": _ROBERTA, "distilbert": _DISTILBERT}


class SpladeHead:
    """The masked-LM head and SpladePooling of one SparseEncoder folder."""

    def __init__(
        self,
        spec: SparseSpec,
        config: dict,
        weights: dict[str, torch.Tensor],
        device: torch.device,
    ):
        model_type = str(config.get("model_type", ""))
        names = _HEADS.get(model_type)
        if names is None:
            raise UnsupportedModel(
                f"sparse encoders of model_type {model_type!r} are not supported "
                f"(supported: {', '.join(sorted(_HEADS))})"
            )
        if names.activation_key is not None:
            act = config.get(names.activation_key, "gelu")
            if act != "gelu":
                raise UnsupportedModel(f"{names.activation_key} {act!r} is not supported")
        self.spec = spec
        self.eps = float(config.get(names.eps_key, 1e-12)) if names.eps_key else 1e-12

        def put(name: str) -> torch.Tensor:
            if name not in weights:
                raise UnsupportedModel(f"model.safetensors lacks the masked-LM tensor {name!r}")
            return weights[name].to(device=device, dtype=torch.float32).contiguous()

        def first(candidates: tuple[str, ...], what: str) -> torch.Tensor:
            for name in candidates:
                if name in weights:
                    return put(name)
            raise UnsupportedModel(
                f"model.safetensors lacks the masked-LM {what} ({candidates[0]})"
            )

        self.dense_w, self.dense_b = put(f"{names.dense}.weight"), put(f"{names.dense}.bias")
        self.norm = (put(f"{names.norm}.weight"), put(f"{names.norm}.bias"))
        decoder = f"{names.decoder}.weight"
        # Tied (the usual case): the file holds the word embeddings only.
        self.decoder_w = put(decoder) if decoder in weights else first(names.words, "decoder")
        self.decoder_b = first(names.biases, "decoder bias")
        self.vocab_size = self.decoder_w.shape[0]

    def __call__(self, hidden: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """hidden [T, H] of packed rows -> [n, vocab] sparse vectors (float32)."""
        rows = []
        start = 0
        for length in lengths:
            rows.append(self._row(hidden[start : start + length].float()))
            start += length
        pooled = torch.stack(rows)
        keep = self.spec.max_active_dims
        if keep is not None and keep < pooled.shape[1]:
            # Values are >= 0, so the largest are the largest in absolute value (as
            # sentence-transformers' select_max_active_dims picks them).
            top = torch.topk(pooled, k=keep, dim=-1).indices
            pooled = torch.zeros_like(pooled).scatter_(-1, top, pooled.gather(-1, top))
        return pooled

    def _row(self, tokens: torch.Tensor) -> torch.Tensor:
        x = F.gelu(F.linear(tokens, self.dense_w, self.dense_b))
        x = F.layer_norm(x, (x.shape[-1],), *self.norm, self.eps)
        logits = F.linear(x, self.decoder_w, self.decoder_b)
        if self.spec.pooling == "max":
            # log1p and relu never decrease, so they commute with max exactly: one row's
            # worth of them instead of one per token.
            return _activate(logits.max(0).values, self.spec.activation)
        return _activate(logits, self.spec.activation).sum(0)


def _activate(x: torch.Tensor, activation: str) -> torch.Tensor:
    x = torch.log1p(torch.relu(x))
    return torch.log1p(x) if activation == "log1p_relu" else x


def sparse_entries(vectors: torch.Tensor) -> list[tuple[list[int], list[float]]]:
    """Each row of [n, vocab] as (indices of its non-zero values, ascending; the values)."""
    entries = []
    for row in vectors:
        indices = torch.nonzero(row, as_tuple=True)[0]
        entries.append((indices.tolist(), row[indices].tolist()))
    return entries
