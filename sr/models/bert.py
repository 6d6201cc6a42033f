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
    attention,
    head_geometry,
    post_norm_feed_forward,
    strip_prefix,
    take,
    weights_on,
)
from sr.models.heads import SEQUENCE, TOKEN, named_head
from sr.models.linear import KernelChoice, Linear, choose_kernel


class _Layer:
    """One transformer block's products and norms (query/key/value joined in one product)."""

    __slots__ = ("ffn_in", "ffn_out", "ln1", "ln2", "out", "qkv")

    def __init__(self, w: dict[str, torch.Tensor], p: str, put, kernel: str):
        attn = f"{p}.attention"
        # Joined once into one [3H, H] tensor, then multiplied as its three row blocks on
        # BLAS (as before the kernel seam: the same bits) or as one product on oneDNN.
        names = ("query", "key", "value")
        qkv_w = put(torch.cat([take(w, f"{attn}.self.{n}.weight") for n in names]))
        qkv_b = put(torch.cat([take(w, f"{attn}.self.{n}.bias") for n in names]))
        self.qkv = Linear.joined(list(zip(qkv_w.chunk(3), qkv_b.chunk(3), strict=True)),
                                 kernel=kernel)  # fmt: skip
        self.out = Linear(put(take(w, f"{attn}.output.dense.weight")),
                          put(take(w, f"{attn}.output.dense.bias")), kernel=kernel)  # fmt: skip
        self.ln1 = (
            put(take(w, f"{attn}.output.LayerNorm.weight")),
            put(take(w, f"{attn}.output.LayerNorm.bias")),
        )
        self.ffn_in, self.ffn_out, self.ln2 = post_norm_feed_forward(w, p, put, kernel)

    def linears(self) -> list[Linear]:
        return [self.qkv, self.out, self.ffn_in, self.ffn_out]


class BertEncoder(PackedEncoder):
    """Hidden states of packed rows, plus the head config.json names, if any."""

    architectures = {  # noqa: RUF012 (read only)
        "BertModel": None,
        "BertForSequenceClassification": SEQUENCE,
        "BertForTokenClassification": TOKEN,
    }
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
        kernel: KernelChoice | None = None,
    ):
        if config.get("hidden_act", "gelu") != "gelu":
            raise UnsupportedModel(f"hidden_act {config.get('hidden_act')!r} is not supported")
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise UnsupportedModel("only absolute position embeddings are supported")
        weights = strip_prefix(weights, self.prefix)
        self.hidden_size, self.num_heads, self.head_dim, self.scale = head_geometry(config)
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.device, self.dtype = device, dtype
        self.kernel = kernel or choose_kernel(device, dtype)

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
        linear = self.kernel.linear
        self.layers = [_Layer(weights, f"encoder.layer.{i}", put, linear) for i in range(count)]
        self.positions = torch.arange(self.max_positions, device=device)
        self.has_head = self._load_head(config, weights, put)

    def _load_head(self, config: dict, weights, put) -> bool:
        unnamed = SEQUENCE if "classifier.weight" in weights else None
        head = named_head(config, self.architectures, unnamed)
        if head == TOKEN:
            self._set_token_head(weights, put, "classifier")
        elif head == SEQUENCE:
            self._set_head(weights, put, "pooler.dense", "classifier")
        return head is not None

    def _set_head(self, weights, put, dense: str, out: str) -> None:
        linear = self.kernel.linear
        self.head_dense = Linear(put(take(weights, f"{dense}.weight")),
                                 put(take(weights, f"{dense}.bias")), kernel=linear)  # fmt: skip
        self.head_out = Linear(put(take(weights, f"{out}.weight")),
                               put(take(weights, f"{out}.bias")), kernel=linear)  # fmt: skip
        self.num_labels = self.head_out.out_features

    def _set_token_head(self, weights, put, out: str) -> None:
        self.head_task = TOKEN
        self.head_out = Linear(put(take(weights, f"{out}.weight")),
                               put(take(weights, f"{out}.bias")),
                               kernel=self.kernel.linear)  # fmt: skip
        self.num_labels = self.head_out.out_features

    def linears(self) -> list[Linear]:
        return self.layers[0].linears() + head_linears(self)

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

    def token_logits(self, hidden: torch.Tensor, packed: Packed) -> torch.Tensor:
        """Logits [T, labels] of every packed token: `classifier` on its hidden state."""
        return self.head_out.consistent(hidden)


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
        qkv = layer.qkv(x)
        q, k, v = (qkv[:tokens] if pad else qkv).view(-1, 3, heads, dim).unbind(1)
        ctx = attention(q, k, v, packed, scale=encoder.scale, mask_for=mask_for)
        if pad:
            ctx = F.pad(ctx, (0, 0, 0, pad))
        x = F.layer_norm(layer.out(ctx, residual=x), (hidden_size,), *layer.ln1, eps)
        x = F.layer_norm(layer.ffn_out(layer.ffn_in(x), residual=x), (hidden_size,),
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

    architectures = {  # noqa: RUF012 (read only)
        "RobertaModel": None,
        "RobertaForSequenceClassification": SEQUENCE,
        "RobertaForTokenClassification": TOKEN,
        "XLMRobertaModel": None,
        "XLMRobertaForSequenceClassification": SEQUENCE,
        "XLMRobertaForTokenClassification": TOKEN,
    }
    prefix = "roberta."
    position_offset_from_padding = True
    second_text_type = False

    def _load_head(self, config: dict, weights, put) -> bool:
        unnamed = SEQUENCE if "classifier.out_proj.weight" in weights else None
        head = named_head(config, self.architectures, unnamed)
        if head == TOKEN:
            self._set_token_head(weights, put, "classifier")
        elif head == SEQUENCE:
            self._set_head(weights, put, "classifier.dense", "classifier.out_proj")
        return head is not None
