"""The bidirectional Gemma3 family in plain torch over packed rows (sr.models.blocks):
transformers' `Gemma3TextModel` with `use_bidirectional_attention: true`, the backbone of
Google's EmbeddingGemma (a sentence-transformers folder: Transformer -> mean Pooling ->
Dense -> Dense -> Normalize; the Dense modules are sr.models.dense's). Embeddings only: no
head. A causal Gemma3 (a generative checkpoint) is refused at load.

What differs from Qwen3 (sr.models.qwen3), as transformers' modeling_gemma3 computes it:
* attention is bidirectional: full layers see the whole row; sliding layers see tokens
  with |i - j| <= sliding_window // 2. transformers turns config.json's `sliding_window`
  W into W // 2 + 1 when the attention is bidirectional and masks |i - j| < that (the
  sliding causal mask ORed with a symmetric window), the same bound as ModernBERT's
  (blocks.sliding_window_mask). A layer slides or not by `layer_types`, or, without it,
  by `sliding_window_pattern` (every sixth layer full by default);
* two rotary tables: `rope_parameters` per layer type (older config.json files:
  `rope_theta` for full layers, `rope_local_base_freq` for sliding ones);
* RMSNorm multiplies by (1 + weight) in float32 and casts last (Qwen3: weight times the
  already cast normalised input); every block has four norms: before and after
  attention, before and after the MLP, the residual added after the post-norms;
* embeddings are scaled by sqrt(hidden_size), the scale rounded to the served dtype;
* attention scores are scaled by `query_pre_attn_scalar` ** -0.5, not head_dim ** -0.5;
* the MLP is GeGLU with the tanh GELU (`down(gelu_tanh(gate(x)) * up(x))`).
Queries and keys get the per-head norms and grouped-query attention works as in Qwen3.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sr.errors import UnsupportedModel
from sr.models.blocks import (
    FULL,
    SLIDING,
    Packed,
    PackedEncoder,
    Rotary,
    attention,
    layer_kinds,
    take,
    window_masks,
)
from sr.models.linear import Linear
from sr.models.qwen3 import normed_rotated_heads

# transformers' Gemma3TextConfig defaults, for keys a config.json leaves out.
_DEFAULT_THETA = {FULL: 1_000_000.0, SLIDING: 10_000.0}
_LEGACY_THETA_KEY = {FULL: "rope_theta", SLIDING: "rope_local_base_freq"}


def _check_config(config: dict) -> None:
    """Refuse, in one line, what this module does not compute."""
    bidirectional = config.get("use_bidirectional_attention")
    if bidirectional is not True:
        raise UnsupportedModel(
            f"gemma3_text with use_bidirectional_attention {bidirectional!r}: a causal Gemma3 "
            "is a generative model, not an embedder sr serves (only true)"
        )
    if config.get("attn_logit_softcapping") is not None:
        raise UnsupportedModel("attn_logit_softcapping is not supported")
    act = config.get("hidden_activation", "gelu_pytorch_tanh")
    if act != "gelu_pytorch_tanh":
        raise UnsupportedModel(
            f"hidden_activation {act!r} is not supported (only gelu_pytorch_tanh)"
        )


def _layer_kinds(config: dict, count: int) -> list[str]:
    """Each layer's kind, as Gemma3TextConfig derives `layer_types` when it is absent:
    the last of each `sliding_window_pattern` layers is full."""
    return layer_kinds(config, count, "sliding_window_pattern", 6, last=True)


def _rope_theta(config: dict, kind: str) -> float:
    """Rotary base of a layer kind: `rope_parameters[kind]` (transformers >= 5), else the
    older top-level keys; `rope_scaling` (older files) applies to full layers only."""
    params = config.get("rope_parameters") or {}
    if any(key not in (FULL, SLIDING) for key in params):
        raise UnsupportedModel(
            f"rope_parameters {params!r} is not supported (one entry per layer type)"
        )
    rope = dict(params.get(kind) or {})
    if kind == FULL and config.get("rope_scaling"):
        rope.update(config["rope_scaling"])
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise UnsupportedModel(
            f"rope scaling {rope_type!r} on {kind} layers is not supported (only default)"
        )
    legacy = config.get(_LEGACY_THETA_KEY[kind], _DEFAULT_THETA[kind])
    return float(rope.get("rope_theta", legacy))


def _norm_scale(put, weight: torch.Tensor) -> torch.Tensor:
    """A Gemma RMSNorm's multiplier, 1 + weight, in float32 from the weight as stored in
    the served dtype (transformers: `1.0 + self.weight.float()`)."""
    return 1.0 + put(weight).float()


def gemma_rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma3RMSNorm: normalised in float32, times (1 + weight) in float32, then cast."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * scale).to(x.dtype)


class _Layer:
    """One block's products, its four norms and its kind (rotary table, windowed or not).
    q, k and v (and gate and up) are each one product of their weights joined, as in
    sr.models.qwen3."""

    __slots__ = (
        "down", "k_norm", "ln_attn_in", "ln_attn_out", "ln_mlp_in", "ln_mlp_out", "mlp_in",
        "o", "q_norm", "qkv", "rotary", "window",
    )  # fmt: skip

    def __init__(self, w, p: str, bias: bool, put, kernel: str, rotary: Rotary, window: bool):
        attn = f"{p}.self_attn"

        def affine(name: str) -> tuple[torch.Tensor, torch.Tensor | None]:
            weight = put(take(w, f"{attn}.{name}.weight"))
            return weight, put(take(w, f"{attn}.{name}.bias")) if bias else None

        self.qkv = Linear.joined([affine(n) for n in ("q_proj", "k_proj", "v_proj")],
                                 kernel=kernel)  # fmt: skip
        self.o = Linear(*affine("o_proj"), kernel=kernel)
        self.q_norm = _norm_scale(put, take(w, f"{attn}.q_norm.weight"))
        self.k_norm = _norm_scale(put, take(w, f"{attn}.k_norm.weight"))
        self.ln_attn_in = _norm_scale(put, take(w, f"{p}.input_layernorm.weight"))
        self.ln_attn_out = _norm_scale(put, take(w, f"{p}.post_attention_layernorm.weight"))
        self.ln_mlp_in = _norm_scale(put, take(w, f"{p}.pre_feedforward_layernorm.weight"))
        self.ln_mlp_out = _norm_scale(put, take(w, f"{p}.post_feedforward_layernorm.weight"))
        mlp = f"{p}.mlp"
        self.mlp_in = Linear.joined(
            [(put(take(w, f"{mlp}.{n}_proj.weight")), None) for n in ("gate", "up")],
            kernel=kernel,
        )
        self.down = Linear(put(take(w, f"{mlp}.down_proj.weight")), kernel=kernel)
        self.rotary = rotary
        self.window = window

    def linears(self) -> list[Linear]:
        return [self.qkv, self.o, self.mlp_in, self.down]


class Gemma3Encoder(PackedEncoder):
    """Hidden states of packed rows (after the final norm); no head."""

    architectures = {"Gemma3TextModel": None}  # noqa: RUF012 (read only)
    has_head = False

    prefix = "model."

    def check_config(self, config: dict) -> None:
        _check_config(config)

    def build(self, config: dict, weights: dict[str, torch.Tensor], put) -> None:
        device, dtype = self.device, self.dtype

        self.hidden_size = int(config["hidden_size"])
        # Read from the tensors, as in Qwen3 (config.json may rely on transformers' defaults).
        self.head_dim = take(weights, "layers.0.self_attn.q_norm.weight").shape[0]
        self.num_heads = take(weights, "layers.0.self_attn.q_proj.weight").shape[0] // self.head_dim
        kv_rows = take(weights, "layers.0.self_attn.k_proj.weight").shape[0]
        self.num_kv_heads = kv_rows // self.head_dim
        if self.num_kv_heads == 0 or self.num_heads % self.num_kv_heads:
            raise UnsupportedModel("num_attention_heads is not a multiple of num_key_value_heads")
        # As transformers writes it, to the last bit: `config.query_pre_attn_scalar**-0.5`.
        self.scale = float(config.get("query_pre_attn_scalar", 256)) ** -0.5
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        self.embed = put(take(weights, "embed_tokens.weight"))
        self.vocab_size = self.embed.shape[0]
        # transformers keeps sqrt(hidden_size) in a buffer of the model's dtype and
        # multiplies the looked-up rows by it in that dtype (bfloat16: sqrt(768) = 27.75).
        self.embed_scale = torch.tensor(self.hidden_size**0.5, dtype=dtype, device=device)
        self.max_positions = int(config.get("max_position_embeddings", 131_072))

        count = int(config["num_hidden_layers"])
        kinds = _layer_kinds(config, count)
        if SLIDING in kinds:
            window = config.get("sliding_window", 4096)
            if not isinstance(window, int) or isinstance(window, bool) or window < 1:
                raise UnsupportedModel(f"sliding_window {window!r} is not supported")
            self.window = window
        else:
            self.window = None
        # cos/sin in the served dtype, rotation in it too, as transformers' Gemma3 does.
        rotary = {
            kind: Rotary(
                self.head_dim, _rope_theta(config, kind), self.max_positions, device, dtype
            )
            for kind in sorted(set(kinds))
        }
        bias = bool(config.get("attention_bias", False))
        self.layers = [
            _Layer(weights, f"layers.{i}", bias, put, self.kernel.linear, rotary[kind],
                   kind == SLIDING)
            for i, kind in enumerate(kinds)
        ]  # fmt: skip
        self.norm = _norm_scale(put, take(weights, "norm.weight"))
        self.positions = torch.arange(self.max_positions, device=device)

    def linears(self) -> list[Linear]:
        return self.layers[0].linears()

    def hidden_states(self, ids: torch.Tensor, packed: Packed) -> torch.Tensor:
        """Last hidden states [T, H] of packed token ids [T] (after the final norm)."""
        positions = packed.positions(self.positions)
        x = self.embed[ids] * self.embed_scale
        tokens = x.shape[0]
        pad = self.padded_rows(tokens)
        if pad:
            # Padding rows only ever meet per-row operations; attention never sees them.
            x = F.pad(x, (0, 0, 0, pad))
        sliding = window_masks(self.window, self.device) if self.window is not None else None
        eps, dim = self.eps, self.head_dim
        q_size, kv_size = self.num_heads * dim, self.num_kv_heads * dim
        for layer in self.layers:
            qkv = layer.qkv(gemma_rms_norm(x, layer.ln_attn_in, eps))
            if pad:
                qkv = qkv[:tokens]
            q, k, v = normed_rotated_heads(
                qkv, (q_size, kv_size, kv_size), dim,
                (gemma_rms_norm, eps, layer.q_norm, layer.k_norm), layer.rotary, positions,
            )  # fmt: skip
            mask_for = sliding if layer.window else None
            ctx = attention(q, k, v, packed, scale=self.scale, mask_for=mask_for)
            if pad:
                ctx = F.pad(ctx, (0, 0, 0, pad))
            x = x + gemma_rms_norm(layer.o(ctx), layer.ln_attn_out, eps)
            gate, up = layer.mlp_in(gemma_rms_norm(x, layer.ln_mlp_in, eps)).chunk(2, dim=1)
            mlp = layer.down(F.gelu(gate, approximate="tanh") * up)
            x = x + gemma_rms_norm(mlp, layer.ln_mlp_out, eps)
        x = gemma_rms_norm(x, self.norm, eps)
        return x[:tokens] if pad else x
