"""The DistilBERT family in plain torch over packed rows (sr.models.blocks): `DistilBertModel`,
`DistilBertForSequenceClassification` and `DistilBertForTokenClassification`.

It is BERT's block stack (sr.models.bert.post_norm_layers: attention, add & LayerNorm,
feed-forward, add & LayerNorm), with these differences:
* config.json names the geometry `dim`, `n_heads`, `n_layers` (and `hidden_dim`, which the
  weights' shapes give anyway), the feed-forward's activation `activation`: "gelu" (the erf
  GELU, fused into the product as BERT's) or "relu" (after the product); any other is
  refused at load;
* no token type embeddings: the embeddings are word + position (ids from 0), then
  LayerNorm; a pair's second text gets nothing of its own, as transformers' DistilBERT
  takes no token types;
* every LayerNorm's eps is 1e-12, fixed in transformers' modeling file (config.json has no
  `layer_norm_eps`; one there would be ignored by transformers, so it is here);
* the layer names: `transformer.layer.N.attention.{q_lin,k_lin,v_lin,out_lin}`,
  `sa_layer_norm`, `ffn.lin1`, `ffn.lin2`, `output_layer_norm`;
* `sinusoidal_pos_embds`: transformers fills `embeddings.position_embeddings` with its
  sinusoidal table at init and saves it as a weight like any other, and at load uses the
  table the file holds: nothing special here. A file without the table is refused (missing
  tensor), where transformers would recompute it;
* the sequence head: `pre_classifier` + ReLU on each row's first ([CLS]) hidden state, then
  `classifier` (BERT's is `pooler.dense` + tanh); the token head: `classifier` on every
  token (as BERT's). A config.json without `architectures` gets the sequence head when the
  file has `pre_classifier`, else the token head when it has `classifier`.
Backbone tensors carry the `distilbert.` prefix in a checkpoint with a head; config.json's
`architectures` names the head (sr.models.heads).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sr.errors import UnsupportedModel
from sr.models.bert import BertEncoder
from sr.models.blocks import Packed, head_geometry, joined_qkv, linear_at, take, weight_and_bias
from sr.models.heads import SEQUENCE, TOKEN, architectures_of
from sr.models.linear import Linear

# transformers' DistilBERT LayerNorms: nn.LayerNorm(dim, eps=1e-12), whatever config.json says.
LAYER_NORM_EPS = 1e-12
ACTIVATIONS = ("gelu", "relu")


class _Relu:
    """A product followed by ReLU (`layer.ffn_in` where the activation is "relu": only the
    erf GELU is fused into a product, sr.models.kernels)."""

    __slots__ = ("linear",)

    def __init__(self, linear: Linear):
        self.linear = linear

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # In place on the product's own fresh output: per element, the bits of F.relu.
        return self.linear(x).relu_()


class _Layer:
    """One transformer block's products and norms, query/key/value joined in one product
    (the slots `post_norm_layers` reads, as BERT's layer)."""

    __slots__ = ("ffn_in", "ffn_out", "lin1", "ln1", "ln2", "out", "qkv")

    def __init__(self, w: dict[str, torch.Tensor], p: str, put, kernel: str, activation: str):
        attn = f"{p}.attention"
        self.qkv = joined_qkv(w, [f"{attn}.{n}" for n in ("q_lin", "k_lin", "v_lin")], put, kernel)
        self.out = linear_at(w, f"{attn}.out_lin", put, kernel)
        self.ln1 = weight_and_bias(w, f"{p}.sa_layer_norm", put)
        fused = "gelu" if activation == "gelu" else None
        self.lin1 = linear_at(w, f"{p}.ffn.lin1", put, kernel, activation=fused)
        self.ffn_in = self.lin1 if fused else _Relu(self.lin1)
        self.ffn_out = linear_at(w, f"{p}.ffn.lin2", put, kernel)
        self.ln2 = weight_and_bias(w, f"{p}.output_layer_norm", put)

    def linears(self) -> list[Linear]:
        return [self.qkv, self.out, self.lin1, self.ffn_out]


def _geometry(config: dict) -> dict:
    """config.json's DistilBERT names as BERT's (transformers' `attribute_map`: a
    config.json may carry either)."""
    return {
        "hidden_size": config.get("dim", config.get("hidden_size")),
        "num_attention_heads": config.get("n_heads", config.get("num_attention_heads")),
        "num_hidden_layers": config.get("n_layers", config.get("num_hidden_layers")),
    }


class DistilBertEncoder(BertEncoder):
    """Hidden states of packed rows, plus the head config.json names, if any. BERT's forward
    (`hidden_states` with one token type, `post_norm_layers`), products and token head;
    layers, embeddings and the sequence head of its own."""

    architectures = architectures_of("DistilBert")
    prefix = "distilbert."
    position_offset_from_padding = False
    second_text_type = False
    sequence_head = ("pre_classifier", "classifier")

    def check_config(self, config: dict) -> None:
        activation = config.get("activation", "gelu")
        if activation not in ACTIVATIONS:
            raise UnsupportedModel(
                f"activation {activation!r} is not supported (supported: {', '.join(ACTIVATIONS)})"
            )
        for key, value in _geometry(config).items():
            if not isinstance(value, int) or value < 1:
                raise UnsupportedModel(f"config.json: {key} is not a count ({value!r})")

    def build(self, config: dict, weights: dict[str, torch.Tensor], put) -> None:
        activation = config.get("activation", "gelu")
        geometry = _geometry(config)
        self.hidden_size, self.num_heads, self.head_dim, self.scale = head_geometry(geometry)
        self.eps = LAYER_NORM_EPS

        self.word = put(take(weights, "embeddings.word_embeddings.weight"))
        self.vocab_size = self.word.shape[0]
        table = take(weights, "embeddings.position_embeddings.weight")
        self.max_positions = table.shape[0]
        # BERT's `hidden_states` indexes this table by position (one token type: a pair's
        # second text is never shifted into a second half).
        self.token_types = 1
        self.position_type = put(table)
        self.emb_ln = weight_and_bias(weights, "embeddings.LayerNorm", put)
        count = geometry["num_hidden_layers"]
        linear = self.kernel.linear
        self.layers = [
            _Layer(weights, f"transformer.layer.{i}", put, linear, activation) for i in range(count)
        ]
        self.positions = torch.arange(self.max_positions, device=self.device)
        self.has_head = self._load_linear_head(config, weights, put)

    def _unnamed_head(self, weights) -> str | None:
        # Without `architectures`, the tensors tell transformers' classes apart:
        # `pre_classifier` only in the sequence (and multiple-choice) head, `classifier`
        # alone only in the token head.
        if "pre_classifier.weight" in weights:
            return SEQUENCE
        return TOKEN if "classifier.weight" in weights else None

    def classify(self, hidden: torch.Tensor, packed: Packed, ids: torch.Tensor) -> torch.Tensor:
        """Logits [n, labels]: `pre_classifier` + ReLU on each row's first-token ([CLS])
        hidden state, then `classifier` (transformers: hidden[:, 0] -> pre_classifier ->
        ReLU -> dropout -> classifier). The first product runs padded to the cut-off, the
        second through `consistent` (a single output as a per-row sum), as BERT's head."""
        states = hidden[packed.first_tokens()]
        rows = states.shape[0]
        pooled = F.relu(self.head_dense(self.pad_to_cutoff(states)))
        return self.head_out.consistent(pooled)[:rows]
