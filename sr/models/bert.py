"""The BERT family in plain torch over packed rows (sr.models.blocks): BERT, and RoBERTa /
XLM-RoBERTa, which differ only in where position ids start and in their classifier head.

Weights follow the Hugging Face names (`BertModel`, `RobertaModel`, `XLMRobertaModel`),
optionally under the `bert.` / `roberta.` prefix of a `*ForSequenceClassification`
checkpoint with its head:
* BERT: `pooler.dense` + tanh on the [CLS] state, then `classifier`;
* RoBERTa / XLM-R: `classifier.dense` + tanh on the <s> state, then `classifier.out_proj`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sr.errors import UnsupportedModel
from sr.models.blocks import (
    Packed,
    PackedEncoder,
    attention,
    head_geometry,
    linear_in_parts,
    strip_prefix,
    take,
    weights_on,
)
from sr.models.gemm_rows import consistent_linear


class _Layer:
    """One transformer block's weights (query/key/value stored as one [3H, H] tensor)."""

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

    def __init__(
        self, w: dict[str, torch.Tensor], p: str, device: torch.device, dtype: torch.dtype
    ):
        put = weights_on(device, dtype)

        attn = f"{p}.attention"
        self.qkv_w = put(
            torch.cat([take(w, f"{attn}.self.{n}.weight") for n in ("query", "key", "value")])
        )
        self.qkv_b = put(
            torch.cat([take(w, f"{attn}.self.{n}.bias") for n in ("query", "key", "value")])
        )
        self.out_w = put(take(w, f"{attn}.output.dense.weight"))
        self.out_b = put(take(w, f"{attn}.output.dense.bias"))
        self.ln1 = (
            put(take(w, f"{attn}.output.LayerNorm.weight")),
            put(take(w, f"{attn}.output.LayerNorm.bias")),
        )
        self.ffn_in_w = put(take(w, f"{p}.intermediate.dense.weight"))
        self.ffn_in_b = put(take(w, f"{p}.intermediate.dense.bias"))
        self.ffn_out_w = put(take(w, f"{p}.output.dense.weight"))
        self.ffn_out_b = put(take(w, f"{p}.output.dense.bias"))
        self.ln2 = (
            put(take(w, f"{p}.output.LayerNorm.weight")),
            put(take(w, f"{p}.output.LayerNorm.bias")),
        )


class BertEncoder(PackedEncoder):
    """Hidden states of packed rows, plus the sequence-classification head if any."""

    prefix = "bert."
    # Position ids of a row start here: 0 for BERT; padding_idx + 1 for RoBERTa.
    position_offset_from_padding = False
    # A pair's second text at token type 1: BERT's tokenizers give it, RoBERTa's give no
    # token types at all (transformers then feeds type 0 everywhere).
    second_text_type = True

    def __init__(
        self,
        config: dict,
        weights: dict[str, torch.Tensor],
        device: torch.device,
        dtype: torch.dtype = torch.float32,
    ):
        if config.get("hidden_act", "gelu") != "gelu":
            raise UnsupportedModel(f"hidden_act {config.get('hidden_act')!r} is not supported")
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise UnsupportedModel("only absolute position embeddings are supported")
        weights = strip_prefix(weights, self.prefix)
        self.hidden_size, self.num_heads, self.head_dim, self.scale = head_geometry(config)
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.device = device

        put = weights_on(device, dtype)

        self.word = put(take(weights, "embeddings.word_embeddings.weight"))
        self.vocab_size = self.word.shape[0]
        offset = int(config.get("pad_token_id", 1)) + 1 if self.position_offset_from_padding else 0
        table = take(weights, "embeddings.position_embeddings.weight")
        self.max_positions = table.shape[0] - offset
        # Token types folded into the position table once: rows [0, P) hold the positions
        # with type 0 (every single-text row, a pair's first text), rows [P, 2P) with type 1
        # (a pair's second text, for checkpoints that have two types: BERT cross-encoders).
        types = take(weights, "embeddings.token_type_embeddings.weight")
        self.token_types = min(2, types.shape[0]) if self.second_text_type else 1
        self.position_type = put(
            torch.cat([table[offset:] + types[t] for t in range(self.token_types)])
        )
        self.emb_ln = (
            put(take(weights, "embeddings.LayerNorm.weight")),
            put(take(weights, "embeddings.LayerNorm.bias")),
        )
        count = int(config["num_hidden_layers"])
        self.layers = [_Layer(weights, f"encoder.layer.{i}", device, dtype) for i in range(count)]
        self.positions = torch.arange(self.max_positions, device=device)
        self.has_head = self._load_head(weights, put)

    def _load_head(self, weights, put) -> bool:
        if "classifier.weight" not in weights:
            return False
        self.head_dense = (put(take(weights, "pooler.dense.weight")),
                           put(take(weights, "pooler.dense.bias")))  # fmt: skip
        self.head_out = (put(take(weights, "classifier.weight")),
                         put(take(weights, "classifier.bias")))  # fmt: skip
        self.num_labels = self.head_out[0].shape[0]
        return True

    def hidden_states(self, ids: torch.Tensor, packed: Packed) -> torch.Tensor:
        """Last hidden states [T, H] of packed token ids [T]."""
        index = packed.positions(self.positions)
        if packed.second_starts is not None and self.token_types == 2:
            index = index + packed.second_text_tokens(self.device) * self.max_positions
        positions = self.position_type[index]
        x = F.layer_norm(self.word[ids] + positions, (self.hidden_size,), *self.emb_ln, self.eps)
        return post_norm_layers(self, x, packed)

    def classify(self, hidden: torch.Tensor, packed: Packed, ids: torch.Tensor) -> torch.Tensor:
        """Logits [n, labels] from each row's first-token ([CLS], <s>) hidden state."""
        return first_token_tanh_head(self, hidden, packed)


def post_norm_layers(encoder, x: torch.Tensor, packed: Packed, mask_for=None) -> torch.Tensor:
    """BERT's block stack (attention, add & LayerNorm, GELU feed-forward, add & LayerNorm)
    over embedded packed rows x [T, H]; MPNet runs the same stack with its position bias
    as `mask_for`. `encoder` has `layers` (of `_Layer` slots), heads, scale and eps."""
    hidden_size, eps = encoder.hidden_size, encoder.eps
    tokens = x.shape[0]
    pad = encoder.padded_rows(tokens)
    if pad:
        # Padding rows only ever meet per-row operations; attention never sees them.
        x = F.pad(x, (0, 0, 0, pad))
    heads, dim = encoder.num_heads, encoder.head_dim
    for layer in encoder.layers:
        qkv = linear_in_parts(x, layer.qkv_w, layer.qkv_b, 3)
        q, k, v = (qkv[:tokens] if pad else qkv).view(tokens, 3, heads, dim).unbind(1)
        ctx = attention(q, k, v, packed, scale=encoder.scale, mask_for=mask_for)
        if pad:
            ctx = F.pad(ctx, (0, 0, 0, pad))
        x = F.layer_norm(
            F.linear(ctx, layer.out_w, layer.out_b) + x, (hidden_size,), *layer.ln1, eps
        )
        inner = F.gelu(F.linear(x, layer.ffn_in_w, layer.ffn_in_b))
        x = F.layer_norm(
            F.linear(inner, layer.ffn_out_w, layer.ffn_out_b) + x, (hidden_size,), *layer.ln2, eps
        )
    return x[:tokens] if pad else x


def first_token_tanh_head(encoder, hidden: torch.Tensor, packed: Packed) -> torch.Tensor:
    """BERT/RoBERTa/MPNet classifier: dense + tanh on each row's first token, then the
    output projection (`encoder.head_dense`, `encoder.head_out`)."""
    states = hidden[packed.first_tokens()]
    rows = states.shape[0]
    pooled = torch.tanh(F.linear(encoder.pad_to_cutoff(states), *encoder.head_dense))
    return consistent_linear(pooled, *encoder.head_out)[:rows]


class RobertaEncoder(BertEncoder):
    """RoBERTa and XLM-RoBERTa: position ids count from `pad_token_id + 1` (what
    transformers' `create_position_ids_from_input_ids` gives a row without padding), one
    token type, and a classifier of its own (`classifier.dense`, `classifier.out_proj`)."""

    prefix = "roberta."
    position_offset_from_padding = True
    second_text_type = False

    def _load_head(self, weights, put) -> bool:
        if "classifier.out_proj.weight" not in weights:
            return False
        self.head_dense = (put(take(weights, "classifier.dense.weight")),
                           put(take(weights, "classifier.dense.bias")))  # fmt: skip
        self.head_out = (put(take(weights, "classifier.out_proj.weight")),
                         put(take(weights, "classifier.out_proj.bias")))  # fmt: skip
        self.num_labels = self.head_out[0].shape[0]
        return True
