"""The BERT family in plain torch, over packed (unpadded) token rows.

Every per-token operation (embeddings, projections, feed-forward, LayerNorm) runs on all
rows' tokens concatenated, so no compute goes to padding; attention runs per group of
equal-length rows. A row's arithmetic therefore does not depend on which other rows share
its forward, which is what lets the worker batch requests under the `exact` profile.

Weights follow the Hugging Face BertModel names, optionally under `bert.` with a
BertForSequenceClassification head (`bert.pooler.dense`, `classifier`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from sr.errors import UnsupportedModel
from sr.models.gemm_rows import min_consistent_rows


def _take(weights: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    try:
        return weights[name]
    except KeyError:
        raise UnsupportedModel(f"model.safetensors lacks the tensor {name!r}") from None


class _Layer:
    """One transformer block's weights, query/key/value fused into one projection."""

    __slots__ = (
        "ffn_in_b",
        "ffn_in_w",
        "ffn_out_b",
        "ffn_out_w",
        "ln1",
        "ln2",
        "out_b",
        "out_w",
        "qkv_b",
        "qkv_w",
    )

    def __init__(self, w: dict[str, torch.Tensor], p: str, device: torch.device):
        def put(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=device, dtype=torch.float32).contiguous()

        attn = f"{p}.attention"
        self.qkv_w = put(
            torch.cat([_take(w, f"{attn}.self.{n}.weight") for n in ("query", "key", "value")])
        )
        self.qkv_b = put(
            torch.cat([_take(w, f"{attn}.self.{n}.bias") for n in ("query", "key", "value")])
        )
        self.out_w = put(_take(w, f"{attn}.output.dense.weight"))
        self.out_b = put(_take(w, f"{attn}.output.dense.bias"))
        self.ln1 = (
            put(_take(w, f"{attn}.output.LayerNorm.weight")),
            put(_take(w, f"{attn}.output.LayerNorm.bias")),
        )
        self.ffn_in_w = put(_take(w, f"{p}.intermediate.dense.weight"))
        self.ffn_in_b = put(_take(w, f"{p}.intermediate.dense.bias"))
        self.ffn_out_w = put(_take(w, f"{p}.output.dense.weight"))
        self.ffn_out_b = put(_take(w, f"{p}.output.dense.bias"))
        self.ln2 = (
            put(_take(w, f"{p}.output.LayerNorm.weight")),
            put(_take(w, f"{p}.output.LayerNorm.bias")),
        )


class BertEncoder:
    """Hidden states of packed rows, plus the BertForSequenceClassification head if any."""

    def __init__(self, config: dict, weights: dict[str, torch.Tensor], device: torch.device):
        if config.get("hidden_act", "gelu") != "gelu":
            raise UnsupportedModel(f"hidden_act {config.get('hidden_act')!r} is not supported")
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise UnsupportedModel("only absolute position embeddings are supported")
        if any(k.startswith("bert.") for k in weights):
            weights = {k.removeprefix("bert."): v for k, v in weights.items()}
        self.hidden_size = int(config["hidden_size"])
        self.num_heads = int(config["num_attention_heads"])
        if self.hidden_size % self.num_heads:
            raise UnsupportedModel("hidden_size is not a multiple of num_attention_heads")
        self.head_dim = self.hidden_size // self.num_heads
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.max_positions = int(config["max_position_embeddings"])
        self.device = device

        def put(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=device, dtype=torch.float32).contiguous()

        self.word = put(_take(weights, "embeddings.word_embeddings.weight"))
        self.vocab_size = self.word.shape[0]
        # Single-segment inputs: token type 0 everywhere, folded into the position table once.
        token_type0 = _take(weights, "embeddings.token_type_embeddings.weight")[0]
        self.position_type = put(
            _take(weights, "embeddings.position_embeddings.weight") + token_type0
        )
        self.emb_ln = (
            put(_take(weights, "embeddings.LayerNorm.weight")),
            put(_take(weights, "embeddings.LayerNorm.bias")),
        )
        count = int(config["num_hidden_layers"])
        self.layers = [_Layer(weights, f"encoder.layer.{i}", device) for i in range(count)]
        self.positions = torch.arange(self.max_positions, device=device)

        self.has_head = "classifier.weight" in weights
        if self.has_head:
            self.pooler_w = put(_take(weights, "pooler.dense.weight"))
            self.pooler_b = put(_take(weights, "pooler.dense.bias"))
            self.classifier_w = put(_take(weights, "classifier.weight"))
            self.classifier_b = put(_take(weights, "classifier.bias"))
            self.num_labels = self.classifier_w.shape[0]

    def _attention(self, qkv: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """Self-attention of packed rows: qkv [T, 3H] -> context [T, H]."""
        heads, dim = self.num_heads, self.head_dim
        if len(lengths) == 1 or len(set(lengths)) == 1:
            n, length = len(lengths), lengths[0]
            q, k, v = qkv.view(n, length, 3, heads, dim).permute(2, 0, 3, 1, 4).unbind(0)
            ctx = F.scaled_dot_product_attention(q, k, v, scale=self._scale)
            return ctx.transpose(1, 2).reshape(n * length, heads * dim)
        # Rows of equal length attend together; the groups are stitched back in order.
        out = torch.empty(qkv.shape[0], heads * dim, device=qkv.device, dtype=qkv.dtype)
        starts = [0]
        for length in lengths:
            starts.append(starts[-1] + length)
        by_length: dict[int, list[int]] = {}
        for index, length in enumerate(lengths):
            by_length.setdefault(length, []).append(index)
        for length, rows in by_length.items():
            if len(rows) == 1:
                part = qkv[starts[rows[0]] : starts[rows[0]] + length].unsqueeze(0)
            else:
                part = torch.stack([qkv[starts[r] : starts[r] + length] for r in rows])
            q, k, v = part.view(len(rows), length, 3, heads, dim).permute(2, 0, 3, 1, 4).unbind(0)
            ctx = F.scaled_dot_product_attention(q, k, v, scale=self._scale)
            ctx = ctx.transpose(1, 2).reshape(len(rows), length, heads * dim)
            for i, r in enumerate(rows):
                out[starts[r] : starts[r] + length] = ctx[i]
        return out

    @property
    def _scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    def calibrate(self) -> int:
        """The BLAS short-matrix cut-off (rows) at the current thread count; cached."""
        return min_consistent_rows(self.device, self.hidden_size, self.hidden_size)

    def _padded_rows(self, rows: int) -> int:
        """Zero rows to append so every product is past the BLAS short-matrix cut-off."""
        return max(0, self.calibrate() - rows)

    def hidden_states(self, ids: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """Last hidden states [T, H] of packed token ids [T] with per-row `lengths`."""
        if len(lengths) == 1:
            positions = self.position_type[: lengths[0]]
        else:
            positions = self.position_type[torch.cat([self.positions[:n] for n in lengths])]
        hidden_size, eps = self.hidden_size, self.eps
        x = F.layer_norm(self.word[ids] + positions, (hidden_size,), *self.emb_ln, eps)
        tokens = x.shape[0]
        pad = self._padded_rows(tokens)
        if pad:
            # Padding rows only ever meet per-row operations; attention never sees them.
            x = F.pad(x, (0, 0, 0, pad))
        for layer in self.layers:
            qkv = F.linear(x, layer.qkv_w, layer.qkv_b)
            ctx = self._attention(qkv[:tokens] if pad else qkv, lengths)
            if pad:
                ctx = F.pad(ctx, (0, 0, 0, pad))
            x = F.layer_norm(
                F.linear(ctx, layer.out_w, layer.out_b) + x, (hidden_size,), *layer.ln1, eps
            )
            inner = F.gelu(F.linear(x, layer.ffn_in_w, layer.ffn_in_b))
            x = F.layer_norm(
                F.linear(inner, layer.ffn_out_w, layer.ffn_out_b) + x,
                (hidden_size,),
                *layer.ln2,
                eps,
            )
        return x[:tokens] if pad else x

    def classify(self, first_token_states: torch.Tensor) -> torch.Tensor:
        """Logits [n, labels] from each row's first-token ([CLS]) hidden state."""
        rows = first_token_states.shape[0]
        pad = self._padded_rows(rows)
        states = F.pad(first_token_states, (0, 0, 0, pad)) if pad else first_token_states
        pooled = torch.tanh(F.linear(states, self.pooler_w, self.pooler_b))
        return F.linear(pooled, self.classifier_w, self.classifier_b)[:rows]
