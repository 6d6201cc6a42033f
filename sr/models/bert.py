"""The BERT family in plain torch over packed rows (sr.models.blocks): BERT, and RoBERTa /
XLM-RoBERTa, which differ only in where position ids start and in their classifier head.

Weights follow the Hugging Face names (`BertModel`, `RobertaModel`, `XLMRobertaModel`),
optionally under the `bert.` / `roberta.` prefix of a checkpoint with a head, the one
config.json's `architectures` names (sr.models.heads):
* `*ForSequenceClassification`: BERT `pooler.dense` + tanh on the [CLS] state, then
  `classifier`; RoBERTa / XLM-R `classifier.dense` + tanh on the <s> state, then
  `classifier.out_proj`;
* `*ForTokenClassification` (all three): `classifier` on every token's hidden state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sr.errors import UnsupportedModel
from sr.models.blocks import (
    Packed,
    PackedEncoder,
    head_geometry,
    joined_attention,
    joined_qkv,
    linear_at,
    post_norm_feed_forward,
    take,
    weight_and_bias,
)
from sr.models.heads import TOKEN, architectures_of
from sr.models.linear import Linear

# What F.layer_norm calls after its Python steps (a torch-function override check and the
# cuDNN flag, an argument ATen's LayerNorm does not use): the same operator, 5 times a
# forward of a 2-layer model without those calls.
_layer_norm = torch.layer_norm


class PostNormLayer:
    """One post-norm transformer block's products and norms, as BERT-shaped families name
    them: query/key/value joined in one product (`qkv`, three names), the attention's
    output product (`out`) and LayerNorm (`norm`), then BERT's GELU feed-forward."""

    __slots__ = ("ffn_in", "ffn_out", "ln1", "ln2", "out", "qkv")

    def __init__(self, w, p: str, put, kernel: str, qkv: list[str], out: str, norm: str):
        self.qkv = joined_qkv(w, qkv, put, kernel)
        self.out = linear_at(w, out, put, kernel)
        self.ln1 = weight_and_bias(w, norm, put)
        self.ffn_in, self.ffn_out, self.ln2 = post_norm_feed_forward(w, p, put, kernel)

    @classmethod
    def bert(cls, w, p: str, put, kernel: str) -> PostNormLayer:
        attn = f"{p}.attention"
        qkv = [f"{attn}.self.{n}" for n in ("query", "key", "value")]
        return cls(w, p, put, kernel, qkv, f"{attn}.output.dense", f"{attn}.output.LayerNorm")

    def linears(self) -> list[Linear]:
        return [self.qkv, self.out, self.ffn_in, self.ffn_out]


class BertEncoder(PackedEncoder):
    """Hidden states of packed rows, plus the head config.json names, if any."""

    architectures = architectures_of("Bert")
    prefix = "bert."
    # Position ids of a row start here: 0 for BERT; padding_idx + 1 for RoBERTa.
    position_offset_from_padding = False
    # A pair's second text at token type 1: BERT's tokenizers give it, RoBERTa's give no
    # token types at all (transformers then feeds type 0 everywhere).
    second_text_type = True
    sequence_head = ("pooler.dense", "classifier")

    def build(self, config: dict, weights: dict[str, torch.Tensor], put) -> None:
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise UnsupportedModel("only absolute position embeddings are supported")
        self.hidden_size, self.num_heads, self.head_dim, self.scale = head_geometry(config)
        self.eps = float(config.get("layer_norm_eps", 1e-12))

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
        self.emb_ln = weight_and_bias(weights, "embeddings.LayerNorm", put)
        count = int(config["num_hidden_layers"])
        linear = self.kernel.linear
        self.layers = [
            PostNormLayer.bert(weights, f"encoder.layer.{i}", put, linear) for i in range(count)
        ]
        self.positions = torch.arange(self.max_positions, device=self.device)
        self.has_head = self._load_linear_head(config, weights, put)

    def linears(self) -> list[Linear]:
        return self.layers[0].linears() + head_linears(self)

    def hidden_states(self, ids: torch.Tensor, packed: Packed) -> torch.Tensor:
        """Last hidden states [T, H] of packed token ids [T]."""
        if packed.second_starts is None and len(packed.lengths) == 1:
            # One text: positions 0..T-1 of type 0 are the table's first T rows, a slice
            # (the same values the gather below copies, without its index operators).
            positions = self.position_type[: packed.tokens]
        else:
            index = packed.positions(self.positions)
            if packed.second_starts is not None and self.token_types == 2:
                index = index + packed.second_text_tokens(self.device) * self.max_positions
            positions = self.position_type[index]
        # index_select: the rows `self.word[ids]` gathers, without Python's indexing path.
        x = _layer_norm(self.word.index_select(0, ids) + positions, (self.hidden_size,),
                        *self.emb_ln, self.eps)  # fmt: skip
        return post_norm_layers(self, x, packed)

    def classify(self, hidden: torch.Tensor, packed: Packed, ids: torch.Tensor) -> torch.Tensor:
        """Logits [n, labels] from each row's first-token ([CLS], <s>) hidden state."""
        return first_token_tanh_head(self, hidden, packed)

    def token_logits(self, hidden: torch.Tensor, packed: Packed) -> torch.Tensor:
        """Logits [T, labels] of every packed token: `classifier` on its hidden state."""
        return self.head_out.consistent(hidden)


def post_norm_layers(encoder, x: torch.Tensor, packed: Packed, mask_for=None) -> torch.Tensor:
    """BERT's block stack (attention, add & LayerNorm, GELU feed-forward, add & LayerNorm)
    over embedded packed rows x [T, H]; MPNet runs the same stack with its position bias
    as `mask_for`. `encoder` has `layers` (of `PostNormLayer` slots), heads, scale and eps."""
    hidden_size, eps = encoder.hidden_size, encoder.eps
    tokens = x.shape[0]
    pad = encoder.padded_rows(tokens)
    if pad:
        # Padding rows only ever meet per-row operations; attention never sees them.
        x = F.pad(x, (0, 0, 0, pad))
    heads, dim, scale = encoder.num_heads, encoder.head_dim, encoder.scale
    for layer in encoder.layers:
        qkv = layer.qkv(x)
        ctx = joined_attention(qkv[:tokens] if pad else qkv, packed, heads, dim, scale=scale,
                               mask_for=mask_for)  # fmt: skip
        if pad:
            ctx = F.pad(ctx, (0, 0, 0, pad))
        x = _layer_norm(layer.out(ctx, residual=x), (hidden_size,), *layer.ln1, eps)
        x = _layer_norm(layer.ffn_out(layer.ffn_in(x), residual=x), (hidden_size,),
                        *layer.ln2, eps)  # fmt: skip
    return x[:tokens] if pad else x


def head_linears(encoder) -> list[Linear]:
    """The classifier's products, if the checkpoint has one."""
    if not encoder.has_head:
        return []
    if encoder.head_task == TOKEN:
        return [encoder.head_out]
    return [encoder.head_dense, encoder.head_out]


def first_token_tanh_head(encoder, hidden: torch.Tensor, packed: Packed) -> torch.Tensor:
    """BERT/RoBERTa/MPNet classifier: dense + tanh on each row's first token, then the
    output projection (`encoder.head_dense`, `encoder.head_out`)."""
    states = hidden[packed.first_tokens()]
    rows = states.shape[0]
    pooled = torch.tanh(encoder.head_dense(encoder.pad_to_cutoff(states)))
    return encoder.head_out.consistent(pooled)[:rows]


class RobertaEncoder(BertEncoder):
    """RoBERTa and XLM-RoBERTa: position ids count from `pad_token_id + 1` (what
    transformers' `create_position_ids_from_input_ids` gives a row without padding), one
    token type, and a classifier of its own (`classifier.dense`, `classifier.out_proj`)."""

    architectures = architectures_of("Roberta", "XLMRoberta")
    prefix = "roberta."
    position_offset_from_padding = True
    second_text_type = False
    sequence_head = ("classifier.dense", "classifier.out_proj")
