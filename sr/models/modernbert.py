"""The ModernBERT family in plain torch over packed rows (sr.models.blocks).

What differs from BERT (sr.models.bert):
* no position table: rotary embeddings on queries and keys, with one theta on global
  layers and another on local ones;
* local layers attend within a sliding window of `local_attention` tokens (|i - j| <=
  local_attention // 2, the same bound as transformers' eager and flash paths); a layer
  is global or local by config `layer_types`, or, in configs written before it existed,
  global when `i % global_attn_every_n_layers == 0`;
* pre-norm blocks (the first layer has no attention norm: the embedding norm precedes
  it), a norm after the last layer, GeGLU feed-forward (`Wi` -> input, gate; act(input) *
  gate -> `Wo`), LayerNorms and linears without biases unless the config asks for them.

Weights follow the Hugging Face names of `ModernBertModel`, optionally under the `model.`
prefix of a checkpoint with a head; config.json's `architectures` names it
(sr.models.heads). The sequence-classification head pools each row
(`classifier_pooling`: its first token, or the mean of its tokens), then `head.dense` +
activation + `head.norm`, then `classifier`; the token-classification head runs the same
`head` and `classifier` on every token.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from sr.errors import UnsupportedModel
from sr.models.blocks import (
    Packed,
    PackedEncoder,
    Rotary,
    activation_of,
    attention,
    head_geometry,
    layer_kinds,
    take,
    window_masks,
)
from sr.models.heads import SEQUENCE, TOKEN, architectures_of, named_head
from sr.models.linear import Linear


def _layer_kinds(config: dict, count: int) -> list[str]:
    """The first of each `global_attn_every_n_layers` layers is full, as ModernBertConfig
    derives `layer_types` when it is absent."""
    return layer_kinds(config, count, "global_attn_every_n_layers", 3, last=False)


def _rope_theta(config: dict, kind: str) -> float:
    """Theta of a layer kind: `rope_parameters` (transformers >= 5) or the older
    `global_rope_theta` / `local_rope_theta` keys, with transformers' defaults."""
    if config.get("rope_scaling"):
        raise UnsupportedModel(f"rope_scaling {config['rope_scaling']!r} is not supported")
    legacy = {"full_attention": ("global_rope_theta", 160_000.0),
              "sliding_attention": ("local_rope_theta", 10_000.0)}[kind]  # fmt: skip
    params = (config.get("rope_parameters") or {}).get(kind) or {}
    if params.get("rope_type", "default") != "default":
        raise UnsupportedModel(f"rope_type {params['rope_type']!r} is not supported")
    return float(params.get("rope_theta", config.get(legacy[0], legacy[1])))


def _affine(w, name: str, bias: bool, put) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias or None) of a linear or LayerNorm, as F.linear / F.layer_norm take them."""
    return put(take(w, f"{name}.weight")), put(take(w, f"{name}.bias")) if bias else None


def _joined(affine: tuple[torch.Tensor, torch.Tensor | None], parts: int, kernel: str) -> Linear:
    """A fused checkpoint weight (Wqkv, Wi) as one product of `parts` row blocks."""
    weight, bias = affine
    biases = bias.chunk(parts) if bias is not None else (None,) * parts
    return Linear.joined(list(zip(weight.chunk(parts), biases, strict=True)), kernel=kernel)


def _rotate(rotary: Rotary, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary positions as transformers' ModernBERT applies them: in float32 (x upcast, the
    cos/sin tables already rounded to the served dtype), the result cast back. A no-op cast
    at float32."""
    return rotary.apply(x.float(), positions).to(x.dtype)


class _Layer:
    """One pre-norm block's weights and its kind (rotary table, windowed or not)."""

    __slots__ = ("attn_norm", "mlp_norm", "out", "qkv", "rotary", "wi", "window", "wo")

    def __init__(
        self, w, index: int, put, biases: tuple[bool, bool, bool], rotary, window, kernel: str
    ):
        attention_bias, mlp_bias, norm_bias = biases
        p = f"layers.{index}"
        # Layer 0's attention norm is an Identity in transformers: the embedding norm
        # has just normalised its input.
        self.attn_norm = _affine(w, f"{p}.attn_norm", norm_bias, put) if index else None
        self.qkv = _joined(_affine(w, f"{p}.attn.Wqkv", attention_bias, put), 3, kernel)
        self.out = Linear(*_affine(w, f"{p}.attn.Wo", attention_bias, put), kernel=kernel)
        self.mlp_norm = _affine(w, f"{p}.mlp_norm", norm_bias, put)
        self.wi = _joined(_affine(w, f"{p}.mlp.Wi", mlp_bias, put), 2, kernel)
        self.wo = Linear(*_affine(w, f"{p}.mlp.Wo", mlp_bias, put), kernel=kernel)
        self.rotary: Rotary = rotary
        self.window: bool = window

    def linears(self) -> list[Linear]:
        return [self.qkv, self.out, self.wi, self.wo]


class ModernBertEncoder(PackedEncoder):
    """Hidden states of packed rows, plus the head config.json names, if any."""

    architectures = architectures_of("ModernBert")
    prefix = "model."

    def check_config(self, config: dict) -> None:
        self.act = activation_of(config, "hidden_activation")

    def build(self, config: dict, weights: dict[str, torch.Tensor], put) -> None:
        self.hidden_size, self.num_heads, self.head_dim, self.scale = head_geometry(config)
        self.eps = float(config.get("norm_eps", 1e-5))
        self.window = int(config.get("local_attention", 128))
        self.max_positions = int(config.get("max_position_embeddings", 8192))

        norm_bias = bool(config.get("norm_bias", False))
        self.word = put(take(weights, "embeddings.tok_embeddings.weight"))
        self.vocab_size = self.word.shape[0]
        self.emb_norm = _affine(weights, "embeddings.norm", norm_bias, put)
        self.final_norm = _affine(weights, "final_norm", norm_bias, put)
        count = int(config["num_hidden_layers"])
        kinds = _layer_kinds(config, count)
        rotary = {
            kind: Rotary(
                self.head_dim,
                _rope_theta(config, kind),
                self.max_positions,
                self.device,
                self.dtype,
            )
            for kind in set(kinds)
        }
        biases = (
            bool(config.get("attention_bias", False)),
            bool(config.get("mlp_bias", False)),
            norm_bias,
        )
        self.layers = [
            _Layer(
                weights,
                i,
                put,
                biases,
                rotary[kind],
                kind == "sliding_attention",
                self.kernel.linear,
            )
            for i, kind in enumerate(kinds)
        ]
        self.positions = torch.arange(self.max_positions, device=self.device)
        self.has_head = self._load_head(config, weights, norm_bias, put)

    def _load_head(self, config: dict, weights, norm_bias: bool, put) -> bool:
        head = named_head(
            config, self.architectures, SEQUENCE if "classifier.weight" in weights else None
        )
        if head is None:
            return False
        if head == TOKEN:
            self.head_task = TOKEN
        else:
            self.pooling = config.get("classifier_pooling", "cls")
            if self.pooling not in ("cls", "mean"):
                raise UnsupportedModel(f"classifier_pooling {self.pooling!r} is not supported")
        self.head_act = activation_of(config, "classifier_activation")
        dense_bias = bool(config.get("classifier_bias", False))
        linear = self.kernel.linear
        self.head_dense = Linear(*_affine(weights, "head.dense", dense_bias, put), kernel=linear)
        self.head_norm = _affine(weights, "head.norm", norm_bias, put)
        self.head_out = Linear(*_affine(weights, "classifier", True, put), kernel=linear)
        self.num_labels = self.head_out.out_features
        return True

    def linears(self) -> list[Linear]:
        head = [self.head_dense, self.head_out] if self.has_head else []
        return self.layers[0].linears() + head

    def hidden_states(self, ids: torch.Tensor, packed: Packed) -> torch.Tensor:
        """Last hidden states [T, H] of packed token ids [T]."""
        hidden_size, eps = self.hidden_size, self.eps
        x = F.layer_norm(self.word[ids], (hidden_size,), *self.emb_norm, eps)
        tokens = x.shape[0]
        pad = self.padded_rows(tokens)
        if pad:
            # Padding rows only ever meet per-row operations; attention never sees them.
            x = F.pad(x, (0, 0, 0, pad))
        positions = packed.positions(self.positions)
        sliding = window_masks(self.window, self.device)
        heads, dim = self.num_heads, self.head_dim
        for layer in self.layers:
            h = (
                F.layer_norm(x, (hidden_size,), *layer.attn_norm, eps)
                if layer.attn_norm is not None
                else x
            )
            qkv = layer.qkv(h)
            q, k, v = (qkv[:tokens] if pad else qkv).view(tokens, 3, heads, dim).unbind(1)
            q, k = _rotate(layer.rotary, q, positions), _rotate(layer.rotary, k, positions)
            mask_for = sliding if layer.window else None
            ctx = attention(q, k, v, packed, scale=self.scale, mask_for=mask_for)
            if pad:
                ctx = F.pad(ctx, (0, 0, 0, pad))
            x = layer.out(ctx, residual=x)
            h = F.layer_norm(x, (hidden_size,), *layer.mlp_norm, eps)
            inputs, gate = layer.wi(h).chunk(2, dim=-1)
            x = layer.wo(self.act(inputs) * gate, residual=x)
        x = F.layer_norm(x, (hidden_size,), *self.final_norm, eps)
        return x[:tokens] if pad else x

    def classify(self, hidden: torch.Tensor, packed: Packed, ids: torch.Tensor) -> torch.Tensor:
        """Logits [n, labels] from each row's first token or mean token (classifier_pooling)."""
        if self.pooling == "cls":
            states = hidden[packed.first_tokens()]
        else:
            # Each row's mean over exactly its own tokens, as transformers' all-ones mask gives.
            states = torch.stack(
                [hidden[a:b].sum(0) / (b - a) for a, b in itertools.pairwise(packed.starts)]
            )
        rows = states.shape[0]
        states = self.pad_to_cutoff(states)
        pooled = F.layer_norm(
            self.head_act(self.head_dense(states)), (self.hidden_size,),
            *self.head_norm, self.eps,
        )  # fmt: skip
        return self.head_out.consistent(pooled)[:rows]

    def token_logits(self, hidden: torch.Tensor, packed: Packed) -> torch.Tensor:
        """Logits [T, labels] of every packed token: `head.dense` + activation +
        `head.norm`, then `classifier`, on its hidden state."""
        tokens = hidden.shape[0]
        states = F.layer_norm(
            self.head_act(self.head_dense(self.pad_to_cutoff(hidden))), (self.hidden_size,),
            *self.head_norm, self.eps,
        )  # fmt: skip
        return self.head_out.consistent(states)[:tokens]
