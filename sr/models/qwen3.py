"""The Qwen3 family in plain torch over packed rows (sr.models.blocks): transformers'
`Qwen3Model`, which Qwen3-Embedding checkpoints are (served with last-token pooling), and
`Qwen3ForSequenceClassification`, whose backbone tensors sit under `model.`.

What differs from BERT: a decoder. Attention is causal; blocks are pre-norm with RMSNorm
and a final `norm`; queries and keys get a per-head RMSNorm (`q_norm`, `k_norm`) and then
rotary positions (restarting at 0 in each row); keys and values may have fewer heads than
queries (grouped-query attention); `head_dim` is its own setting, not hidden / heads; the
MLP is SwiGLU (`down(silu(gate(x)) * up(x))`). There are no position or token-type tables.
The classifier (`score`, no bias) reads the last non-pad token of a row, not the first.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sr.errors import UnsupportedModel
from sr.models.blocks import (
    Packed,
    PackedEncoder,
    Rotary,
    attention,
    rms_norm,
    take,
)
from sr.models.heads import SEQUENCE, architectures_of, named_head
from sr.models.linear import Linear


def _check_config(config: dict) -> float:
    """Refuse what this module does not compute; return the rotary base (`rope_theta`)."""
    act = config.get("hidden_act", "silu")
    if act not in ("silu", "swish"):  # transformers maps both names to SiLU
        raise UnsupportedModel(f"hidden_act {act!r} is not supported (only silu)")
    # transformers 5 writes `rope_parameters`; older config.json files `rope_theta` beside
    # `rope_scaling` (null unless the context was stretched: yarn, dynamic, ...).
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if any(isinstance(v, dict) for v in rope.values()):
        raise UnsupportedModel("per-layer-type rope_parameters are not supported")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise UnsupportedModel(f"rope scaling {rope_type!r} is not supported (only default)")
    # Layers slide when listed so, or (no list) from max_window_layers on when
    # use_sliding_window is set: how transformers' Qwen3Config derives layer_types.
    count = int(config["num_hidden_layers"])
    layer_types = config.get("layer_types")
    if layer_types is None:
        first = int(config.get("max_window_layers", 28))
        slides = config.get("use_sliding_window") and config.get("sliding_window") is not None
        layer_types = ["sliding_attention" if slides and i >= first else "full_attention"
                       for i in range(count)]  # fmt: skip
    if any(t != "full_attention" for t in layer_types):
        raise UnsupportedModel(
            "sliding-window attention layers (use_sliding_window, layer_types) are not supported"
        )
    return float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))


def normed_rotated_heads(
    qkv: torch.Tensor,
    sizes: tuple[int, int, int],
    dim: int,
    norms: tuple,
    rotary: Rotary,
    positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k and v [T, heads, dim] from one packed q/k/v product [T, sum(sizes)]: q and k
    each RMS-normed per head and then rotated, as Qwen3 and Gemma 3 (which took the per-head
    norm from it) both do. `norms` is (norm, eps, q weight, k weight): the two families
    normalise differently."""
    tokens = qkv.shape[0]
    norm, eps, q_weight, k_weight = norms
    q, k, v = qkv.split(sizes, dim=1)
    q = rotary.apply(norm(q.reshape(tokens, -1, dim), q_weight, eps), positions)
    k = rotary.apply(norm(k.reshape(tokens, -1, dim), k_weight, eps), positions)
    return q, k, v.reshape(tokens, -1, dim)


class _Layer:
    """One decoder block's products and norms. q, k and v (and gate and up) are each one
    product of the three (two) weights joined (sr.models.linear): on BLAS one product per
    weight, joined afterwards, since one fused product ran 8-22 % slower with MKL at 1
    thread (docs/benchmarks.md); on oneDNN one fused product."""

    __slots__ = ("down", "k_norm", "ln1", "ln2", "mlp_in", "o", "q_norm", "qkv")

    def __init__(self, w: dict[str, torch.Tensor], p: str, bias: bool, put, kernel: str):
        attn = f"{p}.self_attn"
        self.qkv = Linear.joined(
            [
                (
                    put(take(w, f"{attn}.{n}.weight")),
                    put(take(w, f"{attn}.{n}.bias")) if bias else None,
                )
                for n in ("q_proj", "k_proj", "v_proj")
            ],
            kernel=kernel,
        )
        self.o = Linear(put(take(w, f"{attn}.o_proj.weight")),
                        put(take(w, f"{attn}.o_proj.bias")) if bias else None,
                        kernel=kernel)  # fmt: skip
        self.q_norm = put(take(w, f"{attn}.q_norm.weight"))
        self.k_norm = put(take(w, f"{attn}.k_norm.weight"))
        self.ln1 = put(take(w, f"{p}.input_layernorm.weight"))
        self.ln2 = put(take(w, f"{p}.post_attention_layernorm.weight"))
        mlp = f"{p}.mlp"
        self.mlp_in = Linear.joined(
            [(put(take(w, f"{mlp}.{n}_proj.weight")), None) for n in ("gate", "up")],
            kernel=kernel,
        )
        self.down = Linear(put(take(w, f"{mlp}.down_proj.weight")), kernel=kernel)

    def linears(self) -> list[Linear]:
        return [self.qkv, self.o, self.mlp_in, self.down]


class Qwen3Encoder(PackedEncoder):
    """Hidden states of packed rows, plus the sequence-classification head if any."""

    architectures = architectures_of("Qwen3", token=False)

    prefix = "model."

    def check_config(self, config: dict) -> None:
        self.theta = _check_config(config)

    def build(self, config: dict, weights: dict[str, torch.Tensor], put) -> None:
        device, dtype, theta = self.device, self.dtype, self.theta

        self.hidden_size = int(config["hidden_size"])
        self.num_heads = int(config["num_attention_heads"])
        # Read from the tensors: a config.json without head_dim / num_key_value_heads means
        # transformers' defaults (128 / 32), not hidden / heads.
        self.head_dim = take(weights, "layers.0.self_attn.q_norm.weight").shape[0]
        kv_rows = take(weights, "layers.0.self_attn.k_proj.weight").shape[0]
        self.num_kv_heads = kv_rows // self.head_dim
        if self.num_kv_heads == 0 or self.num_heads % self.num_kv_heads:
            raise UnsupportedModel("num_attention_heads is not a multiple of num_key_value_heads")
        self.scale = self.head_dim**-0.5  # as transformers writes it, to the last bit
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        self.embed = put(take(weights, "embed_tokens.weight"))
        self.vocab_size = self.embed.shape[0]
        bias = bool(config.get("attention_bias", False))
        count = int(config["num_hidden_layers"])
        self.layers = [
            _Layer(weights, f"layers.{i}", bias, put, self.kernel.linear) for i in range(count)
        ]
        self.norm = put(take(weights, "norm.weight"))
        self.max_positions = int(config["max_position_embeddings"])
        # cos/sin in the served dtype, rotation in it too (transformers' Qwen3 rotates in
        # the query's dtype); RMSNorm computes its variance in float32 (blocks.rms_norm).
        self.rotary = Rotary(self.head_dim, theta, self.max_positions, device, dtype)
        self.positions = torch.arange(self.max_positions, device=device)
        pad_id = config.get("pad_token_id")
        self.pad_token_id = None if pad_id is None else int(pad_id)
        unnamed = SEQUENCE if "score.weight" in weights else None
        self.has_head = named_head(config, self.architectures, unnamed) == SEQUENCE
        if self.has_head:
            self.score = Linear(put(weights["score.weight"]), kernel=self.kernel.linear)
            self.num_labels = self.score.out_features

    def linears(self) -> list[Linear]:
        return self.layers[0].linears() + ([self.score] if self.has_head else [])

    def hidden_states(self, ids: torch.Tensor, packed: Packed) -> torch.Tensor:
        """Last hidden states [T, H] of packed token ids [T] (after the final norm)."""
        positions = packed.positions(self.positions)
        x = self.embed[ids]
        tokens = x.shape[0]
        pad = self.padded_rows(tokens)
        if pad:
            # Padding rows only ever meet per-row operations; attention never sees them.
            x = F.pad(x, (0, 0, 0, pad))
        eps, dim = self.eps, self.head_dim
        q_size, kv_size = self.num_heads * dim, self.num_kv_heads * dim
        for layer in self.layers:
            normed = rms_norm(x, layer.ln1, eps)
            qkv = layer.qkv(normed)
            if pad:
                qkv = qkv[:tokens]
            q, k, v = normed_rotated_heads(
                qkv, (q_size, kv_size, kv_size), dim, (rms_norm, eps, layer.q_norm, layer.k_norm),
                self.rotary, positions,
            )  # fmt: skip
            ctx = attention(q, k, v, packed, scale=self.scale, causal=True)
            if pad:
                ctx = F.pad(ctx, (0, 0, 0, pad))
            x = layer.o(ctx, residual=x)
            normed = rms_norm(x, layer.ln2, eps)
            gate, up = layer.mlp_in(normed).chunk(2, dim=1)
            x = layer.down(F.silu(gate) * up, residual=x)
        x = rms_norm(x, self.norm, eps)
        return x[:tokens] if pad else x

    def classify(self, hidden: torch.Tensor, packed: Packed, ids: torch.Tensor) -> torch.Tensor:
        """Logits [n, labels] from each row's last token that is not `pad_token_id`, as
        transformers reads a row (a row that ends in that id, e.g. an appended
        <|endoftext|>, is read one token earlier)."""
        states = hidden[self._read_tokens(packed, ids)]
        rows = states.shape[0]
        states = self.pad_to_cutoff(states)
        return self.score.consistent(states)[:rows]

    def _read_tokens(self, packed: Packed, ids: torch.Tensor) -> list[int]:
        if self.pad_token_id is None:
            return packed.last_tokens()
        read = []
        for start, end in zip(packed.starts, packed.starts[1:], strict=False):
            real = (ids[start:end] != self.pad_token_id).nonzero()
            # transformers' argmax over (index * not-pad) gives index 0 for an all-pad row.
            read.append(start + (int(real[-1]) if len(real) else 0))
        return read
