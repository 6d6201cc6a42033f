"""EncoderModel: tokenizer + family backbone + pooling + optional classification head.

The worker engine calls `tokenize`, `truncate`, `embed` and `classify_logits` on its one
device thread. Rows go through the backbone packed (no padding), so a row's answer is the
same alone or in any batch as far as the kernels allow; the worker's probe checks it.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

from sr.errors import UnsupportedModel
from sr.models.adapter import Adapter, file_sha256, open_adapter
from sr.models.blocks import Packed, torch_dtype
from sr.models.checkpoint import CheckpointLayout, read_layout
from sr.models.dense import DenseStack
from sr.models.families import family_for
from sr.models.gemm_rows import ProductKey
from sr.models.heads import TOKEN, check_architectures, check_served_head
from sr.models.linear import choose_kernel, for_model, product_keys
from sr.models.pooling import pool, pool_arrays
from sr.models.splade import SpladeHead


def torch_device(device: str) -> torch.device:
    """sr device names -> torch devices; ROCm builds of torch use the `cuda` namespace."""
    if device.startswith("rocm"):
        device = "cuda" + device[len("rocm") :]
    return torch.device(device)


class EncoderModel:
    def __init__(
        self,
        artifact_dir: Path,
        layout: CheckpointLayout,
        backbone,
        tokenizer: Tokenizer,
        *,
        kernel: str | None,
        adapter: Adapter | None,
        sparse_head: SpladeHead | None,
    ):
        self.artifact_dir = artifact_dir
        # A LoRA adapter merged into its base's weights (sr.models.adapter), or None.
        self.adapter = adapter
        self.layout = layout
        self.backbone = backbone
        # Set by an engine that computes each row's hidden states as a float32 numpy array
        # [L, H] (ONNX Runtime): `embed` then pools them without a torch operator.
        self.hidden_arrays: Callable[[list[list[int]]], list[np.ndarray]] | None = None
        self.device: torch.device = backbone.device  # the one device the weights live on
        self.tokenizer = tokenizer
        self.max_position_embeddings: int = backbone.max_positions
        self.max_seq_length: int | None = layout.max_seq_length
        # The checkpoint's Dense modules after pooling (float32, on the kernel chosen for
        # float32 here); the last one's out_features is the embedding size.
        self.dense = DenseStack(
            adapter.base_dir if adapter else artifact_dir, layout.dense,
            backbone.hidden_size * len(layout.pooling_modes), self.device,
            choose_kernel(self.device, torch.float32, kernel).linear,
        )  # fmt: skip
        self.embedding_dim: int = self.dense.out_features
        self.pooling_modes = layout.pooling_modes
        self.normalize = layout.normalize
        # config_sentence_transformers.json's prompts (sr.models.prompts); whether pooling
        # counts a prompt's tokens.
        self.prompts = layout.prompts
        self.include_prompt = layout.include_prompt
        # A SparseEncoder folder: `embed` answers SPLADE vectors over the vocabulary.
        self.sparse_head = sparse_head
        if sparse_head is not None:
            self.embedding_dim = sparse_head.vocab_size
            self.normalize = False
        self.head_labels: list[str] | None = None
        check_served_head(layout.config, backbone)
        # "sequence" (one answer per text), "token" (one per token) or None (no head).
        self.head_task: str | None = backbone.head_task if backbone.has_head else None
        if backbone.has_head:
            # Hugging Face's own naming when config.json lists no labels.
            labels = list(layout.head_labels or (f"LABEL_{i}" for i in range(backbone.num_labels)))
            if len(labels) != backbone.num_labels:
                raise UnsupportedModel(
                    f"classifier has {backbone.num_labels} outputs but config.json names "
                    f"{len(labels)} labels"
                )
            self.head_labels = labels
        self.head_activation = (
            head_activation(layout.config, len(self.head_labels)) if self.head_labels else None
        )
        if self.head_task == TOKEN:
            self.head_activation = "softmax"  # per token, as the token-classification pipeline
        # The special tokens around every text, e.g. [CLS] ... [SEP] for BERT.
        self._pair_tokenizers: dict[tuple[int, str], Tokenizer] = {}  # per limit, direction
        empty = tokenizer.encode("").ids
        self._prefix = empty[:1]
        self._suffix = empty[1:] if empty else []
        self._min_tokens = len(empty)

    @property
    def engine_card(self) -> dict:
        """What computes the backbone (the worker's card): torch, or ONNX Runtime's graph."""
        card = getattr(self.backbone, "card", None)
        return card() if card is not None else {"name": "torch", "version": torch.__version__}

    @property
    def kernel_card(self) -> dict[str, str] | None:
        """The kernel serving the backbone's linear products and why (the worker's card)."""
        choice = getattr(self.backbone, "kernel", None)
        return choice.card() if choice is not None else None

    @functools.cached_property
    def weights_sha256(self) -> str:
        """The digest of the artifact's weights file: an adapter's own file for an adapter
        (its base's is on `adapter_card`), so golden references never match a base's."""
        if self.adapter is not None:
            return self.adapter.weights_sha256
        return file_sha256(self.artifact_dir / "model.safetensors")

    @property
    def adapter_card(self) -> dict | None:
        """The adapter and its base (the worker card's `adapter`), or None."""
        return self.adapter.card() if self.adapter is not None else None

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text with its special tokens, not truncated.

        Raises ValueError naming the input index for a non-string or a string that is not
        valid Unicode (a lone surrogate, which JSON can carry)."""
        try:
            if len(texts) == 1:
                return [self.tokenizer.encode(texts[0]).ids]
            return [encoding.ids for encoding in self.tokenizer.encode_batch(texts)]
        except TypeError:
            for index, text in enumerate(texts):
                if not isinstance(text, str):
                    raise ValueError(f"input {index} is not a string") from None
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    raise ValueError(f"input {index} is not valid Unicode text") from None
            raise

    def with_special_tokens(self, ids: list[int]) -> list[int]:
        """A caller's token ids (OpenAI's token-id input) framed by the special tokens the
        tokenizer puts around every text ([CLS] ids [SEP] for BERT), so that ids of a text
        give the same row, and the same vector, as the text itself."""
        return [*self._prefix, *ids, *self._suffix]

    def truncate(self, ids: list[int], max_tokens: int) -> list[int]:
        """At most `max_tokens` ids, keeping the closing special token(s) such as [SEP]."""
        if len(ids) <= max_tokens:
            return ids
        if max_tokens < self._min_tokens:
            raise ValueError(f"max_tokens must be at least {self._min_tokens}, got {max_tokens}")
        keep = max_tokens - len(self._suffix)
        return ids[:keep] + self._suffix

    def truncate_left(self, ids: list[int], max_tokens: int) -> list[int]:
        """At most `max_tokens` ids keeping the text's end (TEI's truncation_direction
        left): the opening special token(s), the last ids of the text, the closing one(s)."""
        if len(ids) <= max_tokens:
            return ids
        if max_tokens < self._min_tokens:
            raise ValueError(f"max_tokens must be at least {self._min_tokens}, got {max_tokens}")
        head, tail = len(self._prefix), len(self._suffix)
        end = len(ids) - tail
        return ids[:head] + ids[end - (max_tokens - head - tail) : end] + ids[end:]

    def _pack(
        self, batch: list[list[int]], second_starts: list[int] | None = None
    ) -> tuple[torch.Tensor, Packed]:
        lengths, flat = self._check_rows(batch)
        packed = Packed(lengths, second_starts)
        return torch.tensor(flat, dtype=torch.long, device=self.device), packed

    def _check_rows(self, batch: list[list[int]]) -> tuple[list[int], list[int]]:
        """(each row's length, every id in order), ValueError for rows the model cannot
        take."""
        if not batch:
            raise ValueError("empty batch")
        lengths = [len(row) for row in batch]
        if min(lengths) < 1:
            raise ValueError("a row has no tokens")
        if max(lengths) > self.max_position_embeddings:
            raise ValueError(
                f"a row has {max(lengths)} tokens; the model takes at most "
                f"{self.max_position_embeddings}"
            )
        flat = batch[0] if len(batch) == 1 else list(itertools.chain.from_iterable(batch))
        # Checked on the Python list: cheaper than two tensor reductions for short rows.
        if min(flat) < 0 or max(flat) >= self.backbone.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.backbone.vocab_size})")
        return lengths, flat

    def calibrate_threads(self) -> int:
        """Measure the BLAS short-matrix cut-off at the thread count now in force (a few ms,
        once per count), so no timed forward pays for it; returns the cut-off in rows."""
        self.dense.calibrate()  # the Dense modules' shapes have cut-offs of their own
        return self.backbone.calibrate()

    def product_keys(self) -> set[ProductKey]:
        """The product shapes whose cut-offs `calibrate_threads` needs: measured side by side
        beforehand where a start has cores to spare (sr.models.gemm_rows.measure_many)."""
        backbone = self.backbone
        return product_keys(backbone.linears(), backbone.dtype) | self.dense.product_keys()

    def embed(
        self,
        batch: list[list[int]],
        *,
        normalize: bool | None = None,
        pooled_from: list[int] | None = None,
    ) -> torch.Tensor:
        """float32 [n, embedding_dim] on the CPU: pooled, normalised if the checkpoint says so.
        `normalize=False` stops before the checkpoint's Normalize module (the vector TEI
        returns for `normalize: false`); True normalises whatever the checkpoint says.
        `pooled_from`: per row, the tokens left out of pooling at its start (a prompt's,
        under `include_prompt: false`). A sparse encoder answers its SPLADE vectors."""
        if normalize is None:
            normalize = self.normalize
        if self.hidden_arrays is not None and self.sparse_head is None:
            # An engine answering numpy rows (ONNX Runtime): no torch operator on the way.
            self._check_rows(batch)
            rows = self.hidden_arrays(batch)
            vectors = pool_arrays(
                rows, self.pooling_modes, normalize, self.dense or None, pooled_from
            )
            return torch.from_numpy(vectors)
        ids, packed = self._pack(batch)
        with torch.inference_mode():
            hidden = self.backbone.hidden_states(ids, packed)
            if self.sparse_head is not None:
                return self.sparse_head(hidden, packed.lengths).cpu()
            # Pooled and normalised in float32 whatever dtype the backbone computes in.
            hidden = hidden.float()
            return pool(
                hidden, packed.lengths, self.pooling_modes, normalize, self.dense or None,
                pooled_from,
            ).cpu()  # fmt: skip

    def token_states(self, batch: list[list[int]]) -> torch.Tensor:
        """float32 [T, H] on the CPU: the backbone's last hidden state of every token of the
        batch, row after row, before pooling (TEI's /embed_all)."""
        ids, packed = self._pack(batch)
        with torch.inference_mode():
            return self.backbone.hidden_states(ids, packed).float().cpu()

    def classify_logits(self, batch: list[list[int]]) -> torch.Tensor:
        """float32 [n, len(head_labels)] on the CPU from the checkpoint's own head."""
        if self.head_labels is None:
            raise ValueError(f"{self.artifact_dir} has no classification head")
        ids, packed = self._pack(batch)
        with torch.inference_mode():
            hidden = self.backbone.hidden_states(ids, packed)
            return self.backbone.classify(hidden, packed, ids).float().cpu()

    def token_logits(self, batch: list[list[int]]) -> torch.Tensor:
        """float32 [T, len(head_labels)] on the CPU from a token-classification head: one row
        per token of the batch, row after row."""
        if self.head_task != TOKEN:
            raise ValueError(f"{self.artifact_dir} has no token-classification head")
        ids, packed = self._pack(batch)
        with torch.inference_mode():
            hidden = self.backbone.hidden_states(ids, packed)
            return self.backbone.token_logits(hidden, packed).float().cpu()

    def encode_pairs(
        self,
        query: str,
        documents: list[str],
        truncate_to: int | None = None,
        direction: str = "right",
    ) -> list[tuple[list[int], int]]:
        """(token ids, start of the second text) of each (query, document) pair, through
        the tokenizer's pair template (BERT: [CLS] q [SEP] d [SEP]; the second text starts
        at the first token of type 1, and is given that type in the forward where the
        family has token types). With `truncate_to`, pairs longer than that are cut the
        way sentence-transformers' CrossEncoder cuts them (longest text first).

        Raises ValueError naming the document index for a string that is not valid text."""
        try:
            return self.encode_pair_list(
                [(query, doc) for doc in documents], truncate_to, direction
            )
        except ValueError:
            for index, doc in enumerate([query, *documents]):
                try:
                    doc.encode("utf-8")
                except UnicodeEncodeError:
                    where = "query" if index == 0 else f"document {index - 1}"
                    raise ValueError(f"{where} is not valid Unicode text") from None
            raise

    def encode_pair_list(
        self, pairs: list[tuple[str, str]], truncate_to: int | None = None, direction: str = "right"
    ) -> list[tuple[list[int], int]]:
        """(token ids, start of the second text) of each (text, text_pair), as
        `encode_pairs` (a text-pair classifier's input). ValueError naming the pair index
        for a text that is not valid Unicode."""
        tokenizer = self.tokenizer
        if truncate_to is not None:
            tokenizer = self._truncating(truncate_to, direction)
        try:
            encodings = tokenizer.encode_batch(pairs)
        except TypeError:
            for index, pair in enumerate(pairs):
                for text in pair:
                    try:
                        text.encode("utf-8")
                    except UnicodeEncodeError:
                        raise ValueError(f"pair {index} is not valid Unicode text") from None
            raise
        pairs = []
        for encoding in encodings:
            ids, types = encoding.ids, encoding.type_ids
            second = types.index(1) if 1 in types else _second_sequence_start(encoding)
            pairs.append((ids, second))
        return pairs

    def _truncating(self, max_tokens: int, direction: str = "right") -> Tokenizer:
        """A copy of the tokenizer that cuts pairs to `max_tokens` ids, longest text first,
        from the end of a text (`right`) or its start (`left`)."""
        cached = self._pair_tokenizers.get((max_tokens, direction))
        if cached is None:
            cached = Tokenizer.from_str(self.tokenizer.to_str())
            cached.no_padding()
            cached.enable_truncation(max_tokens, strategy="longest_first", direction=direction)
            self._pair_tokenizers[(max_tokens, direction)] = cached
        return cached

    def rerank_logits(self, batch: list[list[int]], second_starts: list[int]) -> torch.Tensor:
        """float32 [n, len(head_labels)] of (query, document) pairs from the checkpoint's
        own head (a cross-encoder's relevance logit)."""
        if self.head_labels is None:
            raise ValueError(f"{self.artifact_dir} has no classification head")
        ids, packed = self._pack(batch, second_starts)
        with torch.inference_mode():
            hidden = self.backbone.hidden_states(ids, packed)
            return self.backbone.classify(hidden, packed, ids).float().cpu()


def _second_sequence_start(encoding) -> int:
    """Where the second text of a pair begins when the template gives both texts type 0
    (RoBERTa: <s> q </s></s> d </s>): the first token whose sequence id is 1. The family
    then has no token types, so this only keeps rows comparable in the engine's cache."""
    sequence_ids = encoding.sequence_ids
    return sequence_ids.index(1) if 1 in sequence_ids else len(encoding.ids)


def head_activation(config: dict, labels: int) -> str:
    """How a head's logits become probabilities, as transformers trains them: "sigmoid",
    each label on its own, for multi-label heads (`problem_type`) and single-logit heads
    (a cross-encoder's relevance score, a binary score); else "softmax" over the labels."""
    if config.get("problem_type") == "multi_label_classification" or labels == 1:
        return "sigmoid"
    return "softmax"


def load_tokenizer(folder: Path) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    # Shipped tokenizer.json files often pad/truncate to a fixed length (MiniLM: 128); the
    # engine pads itself and truncates per the deployment's overflow policy.
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def load_model(
    path: Path,
    device: str = "cpu",
    dtype: str | torch.dtype = "float32",
    kernel: str | None = None,
    engine: str = "torch",
) -> EncoderModel:
    """Load a resolved model folder (see `resolve_artifact`) onto `device`, its weights
    computed in `dtype` (float32, bfloat16 or float16; answers come back float32), its
    linear products on `kernel` ("blas" or "onednn"; None: the one probed for the host,
    sr.models.linear.choose_kernel). `engine` "onnxruntime": the backbone's hidden states
    come from ONNX Runtime (sr.models.onnx_engine; float32 on the CPU, products of the
    torch side on BLAS, which the exporter can trace)."""
    folder = Path(path)
    if engine == "onnxruntime":
        from sr.models.onnx_engine import check_onnxruntime

        check_onnxruntime()  # before any weight is read: one line naming the extra
        if torch_dtype(dtype) != torch.float32 or torch_device(device).type != "cpu":
            raise UnsupportedModel("engine onnxruntime serves float32 on the CPU only")
        kernel = "blas"
    adapter = open_adapter(folder)  # a LoRA adapter folder on its base, else None
    layout = adapter.layout if adapter else read_layout(folder)
    family = family_for(layout.model_type)
    check_architectures(layout, family)  # the head config.json names is one sr serves
    target = torch_device(device)
    precision = torch_dtype(dtype)
    if adapter is not None:  # the base's weights with the adapter merged in
        weights = adapter.merged_weights()
    else:
        weights = load_file(str(folder / "model.safetensors"), device="cpu")
    host = choose_kernel(target, precision, kernel)
    # DistilBERT's config.json says `dim` where the others say `hidden_size`.
    width = layout.config.get("hidden_size", layout.config.get("dim", 0))
    chosen = for_model(host, int(width), kernel)
    backbone = family(layout.config, weights, target, precision, chosen)
    tokenizer = load_tokenizer(adapter.tokenizer_dir if adapter else folder)
    sparse_head = (
        SpladeHead(layout.sparse, layout.config, weights, target) if layout.sparse else None
    )
    model = EncoderModel(
        folder, layout, backbone, tokenizer, kernel=kernel, adapter=adapter,
        sparse_head=sparse_head,
    )  # fmt: skip
    model.dtype = precision  # what the backbone computes in (golden tolerance, the card)
    if engine == "onnxruntime":
        from sr.models.onnx_engine import OrtBackbone, export_graph
        from sr.settings import host_cache_dir

        model.backbone = OrtBackbone(backbone, export_graph(model, backbone, host_cache_dir()))
        model.hidden_arrays = model.backbone.hidden_rows
    return model
