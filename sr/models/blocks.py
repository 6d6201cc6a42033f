"""Building blocks every family shares, over packed rows.

A forward runs on all rows' tokens concatenated ([T, ...], no padding), so a row's
arithmetic does not depend on which other rows share the forward: what lets the worker
batch requests under the `exact` profile. Two things are not per token and live here:

* attention, run per group of equal-length rows (`attention`), with the masks a family
  needs (causal, a sliding window, an additive bias such as MPNet's relative positions)
  and grouped-query attention (fewer key/value heads than query heads);
* the short-matrix cut-off: a product of fewer rows than the cut-off may round its rows
  differently from a longer one (sr.models.gemm_rows; MKL: 4 rows at 1 thread, 12 at 2;
  oneDNN's packed kernel: 1-2; never under linear.MIN_ROWS), so a family appends zero
  rows up to it (`PackedEncoder.padded_rows`) before its per-token products, all of which
  go through `sr.models.linear.Linear` on the kernel chosen for the host.

Rotary position embeddings and RMSNorm follow the formulas of the transformers modeling
files the families are checked against (tests/models).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F

from sr.errors import UnsupportedModel
from sr.models.heads import SEQUENCE, TOKEN, named_head
from sr.models.linear import KernelChoice, Linear, choose_kernel, cut_off

# An attention mask for rows of one length: None, or a bool [L, L] (True: may attend) or an
# additive float [heads or 1, L, L], as F.scaled_dot_product_attention takes it.
MaskFor = Callable[[int], torch.Tensor | None]


def take(weights: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    try:
        return weights[name]
    except KeyError:
        raise UnsupportedModel(f"model.safetensors lacks the tensor {name!r}") from None


def strip_prefix(weights: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """Backbone weights without the `*ForSequenceClassification` prefix (`bert.`, ...);
    the head's own tensors keep their names."""
    if not any(k.startswith(prefix) for k in weights):
        return weights
    return {k.removeprefix(prefix): v for k, v in weights.items()}


# The precisions a deployment may serve (config `dtype`, `sr worker --dtype`).
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A served precision by name (`float32`, `bfloat16`, `float16`) or as a torch dtype."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"dtype {dtype!r} is not supported (one of {', '.join(DTYPES)})")


def weights_on(
    device: torch.device, dtype: str | torch.dtype = torch.float32
) -> Callable[[torch.Tensor], torch.Tensor]:
    """How every family stores a weight: in the served dtype (float32 unless asked),
    contiguous, on the serving device. Checkpoints stored in another precision are cast
    once here, as transformers casts them at load."""
    target = torch_dtype(dtype)

    def put(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=target).contiguous()

    return put


def float32_on(device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    """`weights_on(device)`: float32 weights (kept for callers written before `dtype`)."""
    return weights_on(device, torch.float32)


def head_geometry(config: dict) -> tuple[int, int, int, float]:
    """(hidden_size, heads, head_dim, scale) of an encoder whose heads split the hidden
    size evenly (BERT, MPNet, ModernBERT; Qwen3 sets head_dim itself)."""
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    if hidden % heads:
        raise UnsupportedModel("hidden_size is not a multiple of num_attention_heads")
    head_dim = hidden // heads
    return hidden, heads, head_dim, 1.0 / math.sqrt(head_dim)


class Packed:
    """Where each row lies in a packed forward; computed once, used by every layer."""

    __slots__ = (
        "_group_index",
        "_positions",
        "groups",
        "lengths",
        "second_starts",
        "starts",
        "tokens",
    )

    def __init__(self, lengths: list[int], second_starts: list[int] | None = None) -> None:
        self.lengths = lengths
        # Pairs (reranking): where each row's second text begins (its length when it has
        # none); None when no row has a second text. Families with token types (BERT) give
        # those tokens type 1 (`second_text_tokens`).
        if second_starts is not None and all(
            s >= n for s, n in zip(second_starts, lengths, strict=True)
        ):
            second_starts = None
        self.second_starts = second_starts
        starts = [0]
        for length in lengths:
            starts.append(starts[-1] + length)
        self.starts = starts  # row i is tokens starts[i]:starts[i+1]
        self.tokens = starts[-1]
        # Rows of equal length attend together: {length: [row indices]}.
        groups: dict[int, list[int]] = {}
        for index, length in enumerate(lengths):
            groups.setdefault(length, []).append(index)
        self.groups = groups
        self._positions: torch.Tensor | None = None
        self._group_index: dict[int, torch.Tensor] = {}

    @property
    def uniform(self) -> bool:
        return len(self.groups) == 1

    def positions(self, table: torch.Tensor) -> torch.Tensor:
        """Each token's position in its row, 0-based, as indices into `table` [P] (an
        arange on the forward's device, so no tensor is built per call)."""
        if self._positions is None:
            if len(self.lengths) == 1:
                self._positions = table[: self.lengths[0]]
            else:
                self._positions = torch.cat([table[:n] for n in self.lengths])
        return self._positions

    def group_index(self, length: int, device: torch.device) -> torch.Tensor:
        """[rows * length] long: the tokens of the rows of `length` tokens, row after row
        (built once per forward, used by every layer's attention)."""
        index = self._group_index.get(length)
        if index is None:
            tokens = [self.starts[r] + i for r in self.groups[length] for i in range(length)]
            index = self._group_index[length] = torch.tensor(tokens, device=device)
        return index

    def second_text_tokens(self, device: torch.device) -> torch.Tensor | None:
        """[T] long, 1 on each token of a row's second text and 0 elsewhere; None when no
        row is a pair."""
        if self.second_starts is None:
            return None
        rows = zip(self.second_starts, self.lengths, strict=True)
        flags = [i >= start for start, n in rows for i in range(n)]
        return torch.tensor(flags, dtype=torch.long, device=device)

    def first_tokens(self) -> list[int]:
        return self.starts[:-1]

    def last_tokens(self) -> list[int]:
        return [end - 1 for end in self.starts[1:]]


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    packed: Packed,
    *,
    scale: float,
    causal: bool = False,
    mask_for: MaskFor | None = None,
) -> torch.Tensor:
    """Self-attention of packed rows: q [T, heads, D], k and v [T, kv_heads, D] (kv_heads
    divides heads) -> context [T, heads * D]. Each row attends to its own tokens only."""
    # Plain ints: under the ONNX exporter's trace a size read from a tensor becomes a shape
    # computation in the graph; these are constants of the model.
    heads, dim = int(q.shape[1]), int(q.shape[2])
    gqa = bool(k.shape[1] != heads)
    if packed.uniform:
        n, length = len(packed.lengths), packed.lengths[0]
        ctx = _attend(q, k, v, n, length, scale, causal, mask_for, gqa)
        return ctx.reshape(-1, heads * dim)
    out = torch.empty(packed.tokens, heads * dim, device=q.device, dtype=q.dtype)
    for length, rows in packed.groups.items():
        n = len(rows)
        if n == 1:
            span = slice(packed.starts[rows[0]], packed.starts[rows[0]] + length)
            ctx = _attend(q[span], k[span], v[span], 1, length, scale, causal, mask_for, gqa)
            out[span] = ctx.reshape(length, heads * dim)
            continue
        # One gather per tensor and one scatter back per group, not a slice per row.
        index = packed.group_index(length, q.device)
        parts = (t.index_select(0, index) for t in (q, k, v))
        ctx = _attend(*parts, n, length, scale, causal, mask_for, gqa)
        out.index_copy_(0, index, ctx.reshape(n * length, heads * dim))
    return out


def joined_attention(
    qkv: torch.Tensor,
    packed: Packed,
    heads: int,
    dim: int,
    *,
    scale: float,
    mask_for: MaskFor | None = None,
) -> torch.Tensor:
    """Self-attention of packed rows from their joined query/key/value product: qkv
    [T, 3 * heads * D] (each token's q, k and v side by side) -> context [T, heads * D],
    as `attention` computes it."""
    if packed.uniform and not _is_tracing():
        # One view and one permute give SDPA's [n, heads, L, D] q, k and v with the very
        # strides `attention`'s view-and-transpose of each gives them (the same bits), in
        # 3 operators where that path takes 8, and fewer Python calls: rows of one length
        # are the common forward (a one-text request).
        n, length = len(packed.lengths), packed.lengths[0]
        q, k, v = qkv.view(n, length, 3, heads, dim).permute(2, 0, 3, 1, 4).unbind(0)
        ctx = _sdpa(q, k, v, _mask_4d(mask_for, length), scale, False, False)
        return ctx.transpose(1, 2).reshape(packed.tokens, heads * dim)
    q, k, v = qkv.view(-1, 3, heads, dim).unbind(1)
    return attention(q, k, v, packed, scale=scale, mask_for=mask_for)


# torch.jit.is_tracing() is two Python calls around this one (it also answers False under
# TorchScript, which sr never uses); it is asked on every layer's hot path.
_is_tracing = torch._C._is_tracing


def _mask_4d(mask_for: MaskFor | None, length: int) -> torch.Tensor | None:
    mask = mask_for(length) if mask_for is not None else None
    if mask is not None and mask.dim() == 3:
        # [heads, L, L] as [1, heads, L, L]: SDPA's CPU kernel takes its fast path only
        # for a 4-D mask (measured, MPNet's bias at 122 tokens: 2.46 ms -> 1.04 ms).
        mask = mask.unsqueeze(0)
    return mask


def _sdpa(q, k, v, mask, scale, causal, gqa) -> torch.Tensor:
    """[n, h, L, D] -> [n, h, L, D]."""
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal and mask is None, scale=scale, enable_gqa=gqa
    )


def _attend(q, k, v, n, length, scale, causal, mask_for, gqa) -> torch.Tensor:
    """[n * length, h, D] inputs of n rows of one length -> [n, length, heads, D]."""

    def rows(t: torch.Tensor) -> torch.Tensor:
        # -1 and plain ints: one Reshape with a constant shape in an exported graph
        return t.view(n, -1, int(t.shape[1]), int(t.shape[2])).transpose(1, 2)

    mask = _mask_4d(mask_for, length)
    if _is_tracing():
        return _traced_attention(rows(q), rows(k), rows(v), mask, scale, causal, length)
    return _sdpa(rows(q), rows(k), rows(v), mask, scale, causal, gqa).transpose(1, 2)


def _traced_attention(q, k, v, mask, scale, causal, length) -> torch.Tensor:
    """SDPA's arithmetic as the ONNX exporter should write it (sr.models.onnx_engine traces
    this path; the graph is verified against SDPA's answers before it is served): scores,
    softmax, weighted values, the shape of transformers' eager attention that ORT's
    optimiser fuses, where the exporter's own SDPA adds a shape computation per use. Key
    and value heads are repeated for their query heads (the exporter has no grouped-query
    SDPA) and a causal mask is spelled out. [n, h, L, D] -> [n, L, h, D]."""
    if k.shape[1] != q.shape[1]:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    if causal and mask is None:
        mask = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    # Both sides scaled by the root of the scale, as torch's own SDPA math does.
    root = math.sqrt(scale)
    scores = torch.matmul(q * root, k.transpose(-1, -2) * root)
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    return torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2)


def weight_and_bias(w, name: str, put) -> tuple[torch.Tensor, torch.Tensor]:
    """`name.weight` and `name.bias`, stored as the family stores weights (a LayerNorm's
    pair, or a product's)."""
    return put(take(w, f"{name}.weight")), put(take(w, f"{name}.bias"))


def linear_at(w, name: str, put, kernel: str, activation: str | None = None) -> Linear:
    """The product `name` (its weight and bias) on `kernel`."""
    return Linear(*weight_and_bias(w, name, put), kernel=kernel, activation=activation)


def joined_qkv(w, names: list[str], put, kernel: str) -> Linear:
    """Query, key and value products `names` joined once into one [3H, H] tensor, then
    multiplied as its three row blocks on BLAS or as one product on oneDNN."""
    qkv_w = put(torch.cat([take(w, f"{n}.weight") for n in names]))
    qkv_b = put(torch.cat([take(w, f"{n}.bias") for n in names]))
    return Linear.joined(list(zip(qkv_w.chunk(3), qkv_b.chunk(3), strict=True)), kernel=kernel)


def post_norm_feed_forward(w, p: str, put, kernel: str) -> tuple[Linear, Linear, tuple]:
    """BERT's feed-forward of layer `p` as BERT-shaped families name it: (the GELU product
    `intermediate.dense`, whose GELU runs inside it on oneDNN; `output.dense`; the
    `output.LayerNorm` weight and bias)."""
    ffn_in = linear_at(w, f"{p}.intermediate.dense", put, kernel, activation="gelu")
    ffn_out = linear_at(w, f"{p}.output.dense", put, kernel)
    return ffn_in, ffn_out, weight_and_bias(w, f"{p}.output.LayerNorm", put)


# transformers' ACT2FN names whose modules call exactly these torch functions.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "tanh": torch.tanh,
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


def activation_of(config: dict, key: str, default: str = "gelu"):
    """The torch function config.json's `key` names; UnsupportedModel for another name."""
    name = config.get(key, default)
    if name not in ACTIVATIONS:
        raise UnsupportedModel(
            f"{key} {name!r} is not supported (supported: {', '.join(sorted(ACTIVATIONS))})"
        )
    return ACTIVATIONS[name]


FULL, SLIDING = "full_attention", "sliding_attention"


def layer_kinds(config: dict, count: int, every_key: str, every: int, last: bool) -> list[str]:
    """Each layer's kind (FULL or SLIDING attention): config.json's `layer_types`, else
    one full layer in each `every_key` layers (default `every`), the first of each run
    or the `last`: how transformers derives `layer_types` for ModernBERT and Gemma3."""
    kinds = config.get("layer_types")
    if kinds is None:
        every = int(config.get(every_key, every))
        if every < 1:
            raise UnsupportedModel(f"{every_key} {every} is not supported")
        full_at = every - 1 if last else 0
        kinds = [FULL if i % every == full_at else SLIDING for i in range(count)]
    if len(kinds) != count or any(kind not in (FULL, SLIDING) for kind in kinds):
        raise UnsupportedModel(f"layer_types {kinds!r} is not supported")
    return list(kinds)


def window_masks(window: int, device: torch.device) -> MaskFor:
    """mask_for(length) of sliding-window layers: None when the window covers the whole
    row, else `sliding_window_mask`, built once per length. Made once per forward, not kept
    across forwards: a mask is length² and lengths reach thousands."""
    reach = window // 2
    masks: dict[int, torch.Tensor] = {}

    def mask_for(length: int) -> torch.Tensor | None:
        if length <= reach + 1:
            return None
        if length not in masks:
            masks[length] = sliding_window_mask(length, window, device)
        return masks[length]

    return mask_for


def sliding_window_mask(length: int, window: int, device: torch.device) -> torch.Tensor:
    """bool [L, L]: token i attends to j when |i - j| <= window // 2 (ModernBERT's local
    attention, `local_attention` tokens wide)."""
    index = torch.arange(length, device=device)
    return (index[None, :] - index[:, None]).abs() <= window // 2


class Rotary:
    """Rotary position embeddings (the `rotate_half` convention of transformers' Llama,
    Qwen and ModernBERT files): cos/sin tables built once up to `max_positions`."""

    def __init__(
        self,
        head_dim: int,
        theta: float,
        max_positions: int,
        device: torch.device,
        dtype: torch.dtype = torch.float32,
    ):
        inv_freq = 1.0 / (
            theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
        )
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1)
        # Computed in float32, then kept in the served dtype: transformers' rotary modules
        # return `cos.to(dtype=x.dtype)`, `sin.to(dtype=x.dtype)`.
        self.cos = angles.cos().to(device=device, dtype=dtype)
        self.sin = angles.sin().to(device=device, dtype=dtype)

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [T, heads, D] rotated by each token's position [T]."""
        cos = self.cos[positions][:, None, :]
        sin = self.sin[positions][:, None, :]
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as transformers' Llama/Qwen files compute it (in float32)."""
    # One float32 view (no cast where x already is one: a traced cast to its own type is
    # a node ONNX Runtime's optimiser drops and then misses, sr.models.onnx_engine).
    wide = x if x.dtype == torch.float32 else x.float()
    variance = wide.pow(2).mean(-1, keepdim=True)
    normed = wide * torch.rsqrt(variance + eps)
    return weight * (normed if x.dtype == torch.float32 else normed.to(x.dtype))


class PackedEncoder(abc.ABC):
    """What every family shares: the device, the kernel of its products, the cut-off
    padding, the position table, and the load every family starts with: the constructor
    refuses what the family cannot compute (`check_config`), sets `device`, `dtype` and
    `kernel`, strips the backbone's `prefix` and hands the family its own `build` step.
    Subclasses set `hidden_size` in `build`, list their products' shapes in `linears()`
    and implement `hidden_states(ids, packed)`.

    Heads (sr.models.heads): `architectures` maps the Hugging Face classes a family serves
    to the head each names; `head_task` is what a loaded head answers: "sequence"
    (`classify(hidden, packed, ids) -> [n, labels]`, one answer per row), or "token",
    set by a family's `_load_head` when it loads a `*ForTokenClassification` head
    (`token_logits(hidden, packed) -> [T, labels]`, one answer per packed token)."""

    hidden_size: int
    device: torch.device
    dtype: torch.dtype
    kernel: KernelChoice
    head_task: str = "sequence"
    architectures: ClassVar[dict[str, str | None]] = {}
    # The backbone's prefix in a checkpoint with a head (`bert.`, `model.`, ...).
    prefix: ClassVar[str] = ""

    def __init__(
        self,
        config: dict,
        weights: dict[str, torch.Tensor],
        device: torch.device,
        dtype: torch.dtype = torch.float32,
        kernel: KernelChoice | None = None,
    ):
        self.check_config(config)
        self.device, self.dtype = device, dtype
        self.kernel = kernel or choose_kernel(device, dtype)
        self.build(config, strip_prefix(weights, self.prefix), weights_on(device, dtype))

    def check_config(self, config: dict) -> None:
        """Refuse what the family does not compute: by default any activation but BERT's
        erf GELU."""
        if config.get("hidden_act", "gelu") != "gelu":
            raise UnsupportedModel(f"hidden_act {config.get('hidden_act')!r} is not supported")

    @abc.abstractmethod
    def build(self, config: dict, weights: dict[str, torch.Tensor], put) -> None:
        """Load the family's tensors (`weights` without `prefix`; `put` stores one)."""

    # A linear head's sequence products (`_load_linear_head`): dense + activation on each
    # row's first token, then the output product.
    sequence_head: ClassVar[tuple[str, str]] = ("classifier.dense", "classifier.out_proj")

    def _unnamed_head(self, weights) -> str | None:
        """The head of a checkpoint whose config.json names no class: a sequence head when
        its output product is there."""
        return SEQUENCE if f"{self.sequence_head[1]}.weight" in weights else None

    def _load_linear_head(self, config: dict, weights, put) -> bool:
        """The head `architectures` names (or the tensors show): `classifier` on every
        token, or the two `sequence_head` products; whether there is one."""
        head = named_head(config, self.architectures, self._unnamed_head(weights))
        if head == TOKEN:
            self._set_token_head(weights, put, "classifier")
        elif head == SEQUENCE:
            self._set_head(weights, put, *self.sequence_head)
        return head is not None

    def _set_head(self, weights, put, dense: str, out: str) -> None:
        """A sequence head of two products, `dense` then `out`."""
        self.head_dense = linear_at(weights, dense, put, self.kernel.linear)
        self.head_out = linear_at(weights, out, put, self.kernel.linear)
        self.num_labels = self.head_out.out_features

    def _set_token_head(self, weights, put, out: str) -> None:
        """A token head: the product `out` on every token's hidden state."""
        self.head_task = TOKEN
        self.head_out = linear_at(weights, out, put, self.kernel.linear)
        self.num_labels = self.head_out.out_features

    @abc.abstractmethod
    def linears(self) -> list[Linear]:
        """One of each product shape the padded forward runs (a layer's and the head's)."""

    def calibrate(self) -> int:
        """The short-matrix cut-off (rows) of every product shape at the current thread
        count: measured once per count, then a dict lookup per forward."""
        cut_offs = self.__dict__.setdefault("_cut_offs", {})
        threads = torch.get_num_threads()
        rows = cut_offs.get(threads)
        if rows is None:
            rows = cut_offs[threads] = cut_off(self.linears(), self.device, self.dtype)
        return rows

    def padded_rows(self, rows: int) -> int:
        """Zero rows to append so every product is past the short-matrix cut-off."""
        return max(0, self.calibrate() - rows)

    def pad_to_cutoff(self, x: torch.Tensor) -> torch.Tensor:
        """x [rows, H] with zero rows appended up to the cut-off (slice `[:rows]` after)."""
        pad = self.padded_rows(x.shape[0])
        return F.pad(x, (0, 0, 0, pad)) if pad else x
