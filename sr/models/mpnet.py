"""The MPNet family in plain torch over packed rows (sr.models.blocks): `MPNetModel` and
`MPNetForSequenceClassification` (sentence-transformers' all-mpnet-base-v2 is one).

What differs from BERT (sr.models.bert):
* position ids count from 2 (`padding_idx + 1`, padding_idx fixed at 1 by transformers
  whatever config.json says), as RoBERTa's, and there are no token type embeddings;
* a relative position bias, one learnt value per (bucket, head) in
  `encoder.relative_attention_bias`, is added to every layer's attention scores. The
  bucket of a query/key pair depends only on their offset, so it reaches `attention` as an
  additive float mask [heads, L, L], built once per row length per forward;
* the layer names (`attention.attn.q/k/v/o`, `attention.LayerNorm`) and the classifier
  (`classifier.dense` + tanh on the <s> state, then `classifier.out_proj`, as RoBERTa;
  `MPNetForTokenClassification`: `classifier` on every token).
Backbone tensors carry the `mpnet.` prefix in a checkpoint with a head; config.json's
`architectures` names the head (sr.models.heads).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from sr.errors import UnsupportedModel
from sr.models.bert import PostNormLayer, first_token_tanh_head, head_linears, post_norm_layers
from sr.models.blocks import (
    Packed,
    PackedEncoder,
    head_geometry,
    take,
    weight_and_bias,
)
from sr.models.heads import architectures_of
from sr.models.linear import Linear

# transformers' MPNetEncoder.compute_position_bias always buckets into 32 (its default
# argument, not config.relative_attention_num_buckets) with a reach of 128 tokens.
NUM_BUCKETS = 32
MAX_DISTANCE = 128
# Position ids start at padding_idx + 1 = 2 for a row without padding.
POSITION_OFFSET = 2


def relative_buckets(max_positions: int) -> torch.Tensor:
    """Bucket [2P - 1] of each offset `query - key` in [-(P - 1), P - 1] (index offset +
    P - 1). Keys after the query use the upper half of the buckets. In each half, offsets
    under 8 get a bucket each and longer ones share log-spaced buckets up to 128 tokens,
    the last bucket taking everything farther. Computed on the CPU with transformers' float32
    steps, so the boundaries between log-spaced buckets fall exactly where its do."""
    offset = torch.arange(-(max_positions - 1), max_positions)
    distance = offset.abs()
    half = NUM_BUCKETS // 2
    exact = half // 2
    # clamp: the log of distances under `exact` is never used; keep it finite.
    scaled = torch.log(distance.clamp(min=exact).float() / exact) / math.log(MAX_DISTANCE / exact)
    far = (exact + (scaled * (half - exact)).to(torch.long)).clamp(max=half - 1)
    return torch.where(distance < exact, distance, far) + (offset < 0).long() * half


def _layer(w, p: str, put, kernel: str) -> PostNormLayer:
    """BERT's block under MPNet's names (`attention.attn.q/k/v/o`, `attention.LayerNorm`)."""
    attn = f"{p}.attention"
    qkv = [f"{attn}.attn.{n}" for n in "qkv"]
    return PostNormLayer(w, p, put, kernel, qkv, f"{attn}.attn.o", f"{attn}.LayerNorm")


class MPNetEncoder(PackedEncoder):
    """Hidden states of packed rows, plus the head config.json names, if any."""

    architectures = architectures_of("MPNet")
    prefix = "mpnet."

    def check_config(self, config: dict) -> None:
        super().check_config(config)
        buckets = int(config.get("relative_attention_num_buckets", NUM_BUCKETS))
        if buckets != NUM_BUCKETS:
            # transformers would still bucket into 32 and ignore the rest of the table,
            # unlike the original MPNet: no answer to trust.
            raise UnsupportedModel(
                f"relative_attention_num_buckets {buckets} is not supported (only 32)"
            )

    def build(self, config: dict, weights: dict[str, torch.Tensor], put) -> None:
        self.hidden_size, self.num_heads, self.head_dim, self.scale = head_geometry(config)
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        linear = self.kernel.linear

        self.word = put(take(weights, "embeddings.word_embeddings.weight"))
        self.vocab_size = self.word.shape[0]
        table = take(weights, "embeddings.position_embeddings.weight")
        self.max_positions = table.shape[0] - POSITION_OFFSET
        self.position = put(table[POSITION_OFFSET:])
        self.emb_ln = weight_and_bias(weights, "embeddings.LayerNorm", put)
        bias = take(weights, "encoder.relative_attention_bias.weight")  # [buckets, heads]
        if tuple(bias.shape) != (NUM_BUCKETS, self.num_heads):
            raise UnsupportedModel(
                f"encoder.relative_attention_bias has shape {tuple(bias.shape)}, "
                f"expected ({NUM_BUCKETS}, {self.num_heads})"
            )
        # Each head's bias for every offset, [heads, 2P - 1]: a row length's mask is then a
        # gather, with no bucket arithmetic in the forward.
        self.offset_bias = put(bias[relative_buckets(self.max_positions)].T)
        count = int(config["num_hidden_layers"])
        self.layers = [_layer(weights, f"encoder.layer.{i}", put, linear) for i in range(count)]
        self.positions = torch.arange(self.max_positions, device=self.device)
        self.has_head = self._load_linear_head(config, weights, put)

    def linears(self) -> list[Linear]:
        return self.layers[0].linears() + head_linears(self)

    def position_bias(self, length: int) -> torch.Tensor:
        """Additive attention mask [heads, L, L] of a row of `length` tokens."""
        index = self.positions[:length]
        offsets = index[:, None] - index[None, :] + (self.max_positions - 1)
        return self.offset_bias[:, offsets]

    def hidden_states(self, ids: torch.Tensor, packed: Packed) -> torch.Tensor:
        """Last hidden states [T, H] of packed token ids [T]."""
        positions = self.position[packed.positions(self.positions)]
        hidden_size, eps = self.hidden_size, self.eps
        x = F.layer_norm(self.word[ids] + positions, (hidden_size,), *self.emb_ln, eps)
        # Every layer adds the same bias: one mask per row length for this forward, not
        # kept across forwards (at 512 tokens and 12 heads one is 12 MiB).
        masks: dict[int, torch.Tensor] = {}

        def mask_for(length: int) -> torch.Tensor:
            mask = masks.get(length)
            if mask is None:
                mask = masks[length] = self.position_bias(length)
            return mask

        return post_norm_layers(self, x, packed, mask_for)

    def classify(self, hidden: torch.Tensor, packed: Packed, ids: torch.Tensor) -> torch.Tensor:
        """Logits [n, labels] from each row's first-token (<s>) hidden state."""
        return first_token_tanh_head(self, hidden, packed)

    def token_logits(self, hidden: torch.Tensor, packed: Packed) -> torch.Tensor:
        """Logits [T, labels] of every packed token: `classifier` on its hidden state."""
        return self.head_out.consistent(hidden)
