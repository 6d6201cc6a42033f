"""The DeBERTa-v2 family (`model_type: deberta-v2`: DeBERTa-v2, DeBERTa-v3, mDeBERTa-v3) in
plain torch over packed rows (sr.models.blocks), with the heads of `DebertaV2Model`,
`DebertaV2ForSequenceClassification` and `DebertaV2ForTokenClassification`.

What differs from BERT (sr.models.bert):
* disentangled attention: beside content-to-content scores, content-to-position (c2p:
  each query against the embedding of its offset to the key) and position-to-content
  (p2c: each key against the embedding of its offset to the query), with offsets cut into
  log-spaced buckets past `position_buckets // 2`, clamped to `position_buckets` (or
  `max_relative_positions`) each way, and every score scaled by
  1 / sqrt(head_dim * (1 + number of c2p/p2c)). The position embeddings are projected by
  each layer's key/query weights (`share_att_key`) or its own `pos_key_proj` /
  `pos_query_proj`; they depend on no input, so that is done once at load, and a forward
  only multiplies each row's queries and keys by the slice of them its length reaches;
* absolute positions only with `position_biased_input` (v2-style; v3 has none), token
  types only with `type_vocab_size > 0`, an `embed_proj` when `embedding_size` is not the
  hidden size, and an optional convolution beside the first layer (`conv_kernel_size`);
* heads: a ContextPooler (`pooler.dense` + `pooler_hidden_act` on the first token) then
  `classifier`; or `classifier` on every token (`head_task = "token"`). config.json's
  `architectures` picks it. Backbone tensors carry the `deberta.` prefix under a head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sr.errors import UnsupportedModel
from sr.models.blocks import (
    Packed,
    PackedEncoder,
    activation_of,
    head_geometry,
    linear_at,
    post_norm_feed_forward,
    take,
    weight_and_bias,
)
from sr.models.heads import SEQUENCE, TOKEN, architectures_of, named_head
from sr.models.linear import Linear

_POSITION_ATTENTION = ("c2p", "p2c")


def _names(value, key: str, known: tuple[str, ...]) -> list[str]:
    """A `a|b` string or a list (config.json has both forms), each entry one of `known`."""
    if value is None:
        return []
    parts = value.lower().split("|") if isinstance(value, str) else list(value)
    parts = [str(p).strip() for p in parts]
    unknown = [p for p in parts if p not in known]
    if unknown:
        raise UnsupportedModel(
            f"{key} {unknown[0]!r} is not supported (supported: {', '.join(known)})"
        )
    return parts


def log_buckets(offsets: torch.Tensor, buckets: int, max_position: int) -> torch.Tensor:
    """transformers' `make_log_bucket_position` with its float32 steps (so every boundary
    falls where its does): offsets within `buckets // 2` kept, longer ones log-spaced,
    reaching `buckets - 1` at `max_position - 1` and beyond it past the table (clamped by
    the caller)."""
    sign = torch.sign(offsets)
    mid = buckets // 2
    inside = (offsets < mid) & (offsets > -mid)
    distance = torch.where(inside, torch.tensor(mid - 1), offsets.abs())
    scale = torch.log(torch.tensor((max_position - 1) / mid))
    log_pos = torch.ceil(torch.log(distance / mid) / scale * (mid - 1)) + mid
    return torch.where(distance <= mid, offsets.float(), log_pos * sign).long()


def relative_columns(max_positions: int, span: int, buckets: int, max_relative: int):
    """The column of the position table [2 * span] that each offset `query - key` in
    [-(P - 1), P - 1] reads (index offset + P - 1): bucketed when `buckets > 0`, then
    clamped to the table. Computed on the CPU."""
    offsets = torch.arange(-(max_positions - 1), max_positions)
    if buckets > 0 and max_relative > 0:
        offsets = log_buckets(offsets, buckets, max_relative)
    return (offsets + span).clamp(0, 2 * span - 1)


class _Layer:
    """One post-norm block: q/k/v joined, output + LayerNorm, GELU feed-forward +
    LayerNorm, and the layer's projections of the position table ([heads, 2 * span, D],
    already divided by the score scale; None without c2p / p2c)."""

    __slots__ = ("ffn_in", "ffn_out", "ln1", "ln2", "out", "pos_key", "pos_query", "qkv")

    def __init__(self, w, p: str, put, kernel: str, positions: _PositionTable | None):
        attn = f"{p}.attention"
        names = ("query_proj", "key_proj", "value_proj")
        qkv_w = [take(w, f"{attn}.self.{n}.weight") for n in names]
        qkv_b = [take(w, f"{attn}.self.{n}.bias") for n in names]
        self.qkv = Linear.joined([(put(a), put(b)) for a, b in zip(qkv_w, qkv_b, strict=True)],
                                 kernel=kernel)  # fmt: skip
        self.out = linear_at(w, f"{attn}.output.dense", put, kernel)
        self.ln1 = weight_and_bias(w, f"{attn}.output.LayerNorm", put)
        self.ffn_in, self.ffn_out, self.ln2 = post_norm_feed_forward(w, p, put, kernel)
        self.pos_key = self.pos_query = None
        if positions is not None:
            shared = positions.share_key
            if "c2p" in positions.kinds:
                name = "key_proj" if shared else "pos_key_proj"
                self.pos_key = positions.project(w, f"{attn}.self.{name}", put)
            if "p2c" in positions.kinds:
                name = "query_proj" if shared else "pos_query_proj"
                self.pos_query = positions.project(w, f"{attn}.self.{name}", put)

    def linears(self) -> list[Linear]:
        return [self.qkv, self.out, self.ffn_in, self.ffn_out]


class _PositionTable:
    """The relative position embeddings (LayerNorm'd when `norm_rel_ebd` says so), in
    float32, and what each layer needs to project them."""

    def __init__(self, w, config: dict, kinds: list[str], heads: int, score_scale: float):
        self.kinds = kinds
        self.share_key = bool(config.get("share_att_key", False))
        self.heads = heads
        self.score_scale = score_scale
        table = take(w, "encoder.rel_embeddings.weight").float()
        norms = _names(config.get("norm_rel_ebd", "none"), "norm_rel_ebd", ("none", "layer_norm"))
        if "layer_norm" in norms:
            eps = float(config.get("layer_norm_eps", 1e-7))
            ln = (take(w, "encoder.LayerNorm.weight").float(),
                  take(w, "encoder.LayerNorm.bias").float())  # fmt: skip
            table = F.layer_norm(table, (table.shape[1],), *ln, eps)
        self.table = table

    def project(self, w, name: str, put) -> torch.Tensor:
        """[heads, 2 * span, D] of the table through one of the layer's projections,
        divided by the score scale as transformers divides c2p and p2c."""
        weight = take(w, f"{name}.weight").float()
        bias = take(w, f"{name}.bias").float()
        projected = F.linear(self.table, weight, bias) / self.score_scale
        rows = projected.shape[0]
        return put(projected.view(rows, self.heads, -1).transpose(0, 1))


class DebertaV2Encoder(PackedEncoder):
    """Hidden states of packed rows, plus the head `architectures` names, if any."""

    architectures = architectures_of("DebertaV2")

    prefix = "deberta."

    def build(self, config: dict, weights: dict[str, torch.Tensor], put) -> None:
        # DeBERTa folders always name their class; none named is the bare model.
        head = named_head(config, self.architectures, None)
        self.hidden_size, self.num_heads, self.head_dim, _ = head_geometry(config)
        if int(config.get("attention_head_size", self.head_dim)) != self.head_dim:
            raise UnsupportedModel(
                f"attention_head_size {config['attention_head_size']} is not supported "
                "(only hidden_size / num_attention_heads)"
            )
        self.eps = float(config.get("layer_norm_eps", 1e-7))
        linear = self.kernel.linear

        kinds = _names(config.get("pos_att_type"), "pos_att_type", _POSITION_ATTENTION)
        # transformers counts c2p and p2c in the scale even without relative_attention.
        self.score_scale = float(torch.sqrt(torch.tensor(float(self.head_dim)) * (1 + len(kinds))))
        self.scale = 1.0 / self.score_scale
        positions = None
        self.max_positions = int(config.get("max_position_embeddings", 512))
        self._load_embeddings(config, weights, put, linear)
        if config.get("relative_attention", False) and kinds:
            max_relative = int(config.get("max_relative_positions", -1))
            if max_relative < 1:
                max_relative = self.max_positions
            buckets = int(config.get("position_buckets", -1))
            self.span = buckets if buckets > 0 else max_relative
            positions = _PositionTable(weights, config, kinds, self.num_heads, self.score_scale)
            if positions.table.shape[0] != 2 * self.span:
                raise UnsupportedModel(
                    f"encoder.rel_embeddings has {positions.table.shape[0]} rows, "
                    f"expected {2 * self.span}"
                )
            columns = relative_columns(self.max_positions, self.span, buckets, max_relative)
            self.columns = columns.to(self.device)
        self.relative = positions is not None
        count = int(config["num_hidden_layers"])
        self.layers = [
            _Layer(weights, f"encoder.layer.{i}", put, linear, positions) for i in range(count)
        ]
        self._load_conv(config, weights, put, linear)
        self.positions = torch.arange(self.max_positions, device=self.device)
        self.has_head = head is not None
        if head is not None:
            self._load_head(config, weights, head, put, linear)

    def _load_embeddings(self, config: dict, weights, put, linear: str) -> None:
        word = take(weights, "embeddings.word_embeddings.weight")
        self.word = put(word)
        self.vocab_size, width = word.shape
        # Position and token-type rows folded into one table, as BERT's: row t * P + p
        # holds position p (zeros without `position_biased_input`) plus type t.
        self.token_types = 0
        table = None
        if config.get("position_biased_input", True):
            table = take(weights, "embeddings.position_embeddings.weight")
            self.max_positions = min(self.max_positions, table.shape[0])
            table = table[: self.max_positions]
        if int(config.get("type_vocab_size", 0)) > 0:
            types = take(weights, "embeddings.token_type_embeddings.weight")
            self.token_types = min(2, types.shape[0])
            base = table if table is not None else torch.zeros(self.max_positions, width)
            table = torch.cat([base + types[t] for t in range(self.token_types)])
        self.position_type = put(table) if table is not None else None
        self.embed_proj = None
        if width != self.hidden_size:
            self.embed_proj = Linear(put(take(weights, "embeddings.embed_proj.weight")),
                                     kernel=linear)  # fmt: skip
        self.emb_ln = weight_and_bias(weights, "embeddings.LayerNorm", put)

    def _load_conv(self, config: dict, weights, put, linear: str) -> None:
        """ConvLayer: a 1-D convolution over each row's embeddings, added to the first
        layer's output. Run as one product over each token's window of k embeddings
        (zeros past the row's ends, as the convolution's padding gives)."""
        self.conv = None
        size = int(config.get("conv_kernel_size", 0))
        if size <= 0:
            return
        if size % 2 == 0:
            raise UnsupportedModel(f"conv_kernel_size {size} is not supported (odd sizes only)")
        if int(config.get("conv_groups", 1)) != 1:
            raise UnsupportedModel(f"conv_groups {config['conv_groups']} is not supported (only 1)")
        self.conv_act = activation_of(config, "conv_act", "tanh")
        weight = take(weights, "encoder.conv.conv.weight")  # [H, H, k]
        # [H, k * H]: output o reads tap t of channel c at column t * H + c.
        flat = weight.permute(0, 2, 1).reshape(weight.shape[0], -1)
        self.conv = Linear(put(flat), put(take(weights, "encoder.conv.conv.bias")), kernel=linear)
        self.conv_size = size
        self.conv_ln = weight_and_bias(weights, "encoder.conv.LayerNorm", put)

    def _load_head(self, config: dict, weights, head: str, put, linear: str) -> None:
        self.head_task = head
        if head == SEQUENCE:
            self.pooler_act = activation_of(config, "pooler_hidden_act", "gelu")
            self.head_dense = linear_at(weights, "pooler.dense", put, linear)
            if self.head_dense.in_features != self.hidden_size:
                raise UnsupportedModel(
                    f"pooler_hidden_size {self.head_dense.in_features} is not supported "
                    f"(only hidden_size, {self.hidden_size})"
                )
        self.head_out = linear_at(weights, "classifier", put, linear)
        self.num_labels = self.head_out.out_features

    def linears(self) -> list[Linear]:
        extra = [x for x in (self.embed_proj, self.conv) if x is not None]
        if self.has_head:
            extra.append(self.head_out)
            if self.head_task == SEQUENCE:
                extra.append(self.head_dense)
        return self.layers[0].linears() + extra

    # -- the forward ------------------------------------------------------------------

    def hidden_states(self, ids: torch.Tensor, packed: Packed) -> torch.Tensor:
        """Last hidden states [T, H] of packed token ids [T]."""
        x = self.word[ids]
        if self.position_type is not None:
            index = packed.positions(self.positions)
            if packed.second_starts is not None and self.token_types == 2:
                index = index + packed.second_text_tokens(self.device) * self.max_positions
            x = x + self.position_type[index]
        tokens = x.shape[0]
        pad = self.padded_rows(tokens)
        if pad:
            # Padding rows only ever meet per-row operations; attention never sees them.
            x = F.pad(x, (0, 0, 0, pad))
        if self.embed_proj is not None:
            x = self.embed_proj(x)
        hidden_size, eps = self.hidden_size, self.eps
        x = F.layer_norm(x, (hidden_size,), *self.emb_ln, eps)
        embedded = x
        heads, dim = self.num_heads, self.head_dim
        offsets = _RowOffsets(self) if self.relative else None
        for number, layer in enumerate(self.layers):
            qkv = layer.qkv(x)
            q, k, v = (qkv[:tokens] if pad else qkv).view(tokens, 3, heads, dim).unbind(1)
            ctx = self._attention(layer, q, k, v, packed, offsets)
            if pad:
                ctx = F.pad(ctx, (0, 0, 0, pad))
            x = F.layer_norm(layer.out(ctx, residual=x), (hidden_size,), *layer.ln1, eps)
            x = F.layer_norm(layer.ffn_out(layer.ffn_in(x), residual=x), (hidden_size,),
                             *layer.ln2, eps)  # fmt: skip
            if number == 0 and self.conv is not None:
                x = self._convolve(embedded, x, packed)
        return x[:tokens] if pad else x

    def _convolve(self, embedded: torch.Tensor, x: torch.Tensor, packed: Packed) -> torch.Tensor:
        """ConvLayer: LayerNorm(x + act(conv(embedded))), the convolution within each row."""
        rows, width = embedded.shape
        reach = (self.conv_size - 1) // 2
        position = F.pad(packed.positions(self.positions), (0, rows - packed.tokens), value=-1)
        length = torch.tensor(
            [n for n in packed.lengths for _ in range(n)] + [0] * (rows - packed.tokens),
            device=self.device,
        )
        padded = F.pad(embedded, (0, 0, reach, reach))
        taps = []
        for shift in range(-reach, reach + 1):
            inside = (position + shift >= 0) & (position + shift < length)
            window = padded[reach + shift : reach + shift + rows]
            taps.append(torch.where(inside[:, None], window, 0.0))
        out = self.conv_act(self.conv(torch.cat(taps, dim=1)))
        return F.layer_norm(x + out, (width,), *self.conv_ln, self.eps)

    def _attention(self, layer: _Layer, q, k, v, packed: Packed, offsets) -> torch.Tensor:
        """Disentangled self-attention of packed rows (q, k, v [T, heads, D]) -> [T, H],
        per group of equal-length rows, as sr.models.blocks.attention runs it."""
        heads, dim = self.num_heads, self.head_dim
        if packed.uniform:
            n, length = len(packed.lengths), packed.lengths[0]
            ctx = self._attend(layer, q, k, v, n, length, offsets)
            return ctx.reshape(n * length, heads * dim)
        out = torch.empty(packed.tokens, heads * dim, device=q.device, dtype=q.dtype)
        for length, rows in packed.groups.items():
            n = len(rows)
            if n == 1:
                span = slice(packed.starts[rows[0]], packed.starts[rows[0]] + length)
                ctx = self._attend(layer, q[span], k[span], v[span], 1, length, offsets)
                out[span] = ctx.reshape(length, heads * dim)
                continue
            index = packed.group_index(length, q.device)
            parts = (t.index_select(0, index) for t in (q, k, v))
            ctx = self._attend(layer, *parts, n, length, offsets)
            out.index_copy_(0, index, ctx.reshape(n * length, heads * dim))
        return out

    def _attend(self, layer: _Layer, q, k, v, n: int, length: int, offsets) -> torch.Tensor:
        """[n * length, heads, D] of n rows of one length -> [n, length, heads, D]."""

        def rows(t: torch.Tensor) -> torch.Tensor:
            return t.view(n, length, t.shape[1], t.shape[2]).transpose(1, 2)

        q, k, v = rows(q), rows(k), rows(v)
        bias = None
        if offsets is not None:
            columns, columns_t, window = offsets.of(length)
            shape = (n, self.num_heads, length, length)
            if layer.pos_key is not None:
                # c2p: query i against the embedding of its offset to key j.
                scores = self._by_offset(q, layer.pos_key, window, n)
                bias = torch.gather(scores, -1, columns.expand(shape))
            if layer.pos_query is not None:
                # p2c: key j against the embedding of the same offset, gathered per key.
                scores = self._by_offset(k, layer.pos_query, window, n)
                p2c = torch.gather(scores, -1, columns_t.expand(shape)).transpose(-1, -2)
                bias = p2c.contiguous() if bias is None else bias + p2c
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=self.scale)
        return ctx.transpose(1, 2)

    def _by_offset(self, x: torch.Tensor, table: torch.Tensor, window: slice, n: int):
        """[n, heads, L, W]: each token of x [n, heads, L, D] against the projected
        position table's columns in `window`, one product per (row, head). Both operands
        are copied into the same contiguous layout whatever n is: torch picks another
        kernel for a strided or broadcast operand, and a row's bits then changed between
        alone and beside another row of its length (measured at 3-6 tokens)."""
        heads, length, dim = x.shape[1], x.shape[2], x.shape[3]
        part = table[:, window]
        width = part.shape[1]
        keys = part.transpose(1, 2).expand(n, heads, dim, width).contiguous()
        out = torch.bmm(x.contiguous().view(n * heads, length, dim),
                        keys.view(n * heads, dim, width))  # fmt: skip
        return out.view(n, heads, length, width)

    # -- heads ------------------------------------------------------------------------

    def classify(self, hidden: torch.Tensor, packed: Packed, ids: torch.Tensor) -> torch.Tensor:
        """Logits [n, labels]: ContextPooler (dense + pooler_hidden_act on each row's first
        token, [CLS]) then `classifier`."""
        if self.head_task != SEQUENCE:
            raise ValueError("this checkpoint's head labels tokens (token_logits), not texts")
        states = hidden[packed.first_tokens()]
        rows = states.shape[0]
        pooled = self.pooler_act(self.head_dense(self.pad_to_cutoff(states)))
        return self.head_out.consistent(pooled)[:rows]

    def token_logits(self, hidden: torch.Tensor, packed: Packed) -> torch.Tensor:
        """Logits [T, labels] of every token: `classifier` on its hidden state."""
        if self.head_task != TOKEN:
            raise ValueError("this checkpoint's head labels texts (classify), not tokens")
        return self.head_out.consistent(hidden)


class _RowOffsets:
    """Per forward, for each row length L: the column of the layer's position projections
    each (query, key) pair reads, [L, L] and transposed, relative to the window of columns
    that length reaches (a slice of the 2 * span). Built once per length per forward (at
    512 tokens the two are 4 MiB)."""

    def __init__(self, encoder: DebertaV2Encoder):
        self.encoder = encoder
        self.built: dict[int, tuple[torch.Tensor, torch.Tensor, slice]] = {}

    def of(self, length: int) -> tuple[torch.Tensor, torch.Tensor, slice]:
        found = self.built.get(length)
        if found is None:
            encoder = self.encoder
            middle = encoder.max_positions - 1
            reach = encoder.columns[middle - (length - 1) : middle + length]
            low, high = int(reach[0]), int(reach[-1])
            index = encoder.positions[:length]
            offsets = index[:, None] - index[None, :] + middle
            columns = encoder.columns[offsets] - low
            found = (columns, columns.T.contiguous(), slice(low, high + 1))
            self.built[length] = found
        return found
