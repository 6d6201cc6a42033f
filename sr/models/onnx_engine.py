"""The onnxruntime engine: a family's backbone exported to ONNX and run by ONNX Runtime.

Why: one short text spends about a fifth of the eager forward between operators (Python
and torch's dispatch, measured in docs/benchmarks.md); ORT runs the same graph with a few
microseconds between kernels. Everything around the backbone stays sr's: the tokenizer,
the limits, pooling, the Dense modules, normalisation and the heads run on the hidden
states ORT returns through the torch engine's own code, so a deployment answers what the
torch engine answers (within 1e-5). Embeddings take ORT's rows as numpy arrays straight to
sr.models.pooling's numpy pooling (`hidden_rows`): no torch operator between the run and
the vector.

Rules:
* Export: torch's TorchScript exporter traces the family's own `hidden_states` on one row
  of the model's limit in tokens (at most TRACE_TOKENS), with the token axis dynamic. The trace
  runs with the short-matrix cut-off at 0 (ORT's products are not torch's, and a padded
  row count would be traced as a constant). Families with two token types (BERT
  cross-encoders) get a second input, each token's type, so a pair's second text is
  served as the torch engine serves it.
* Fusions: ORT's transformer optimizer (`onnxruntime.transformers.optimizer`) rewrites the
  graph where its patterns match. A graph is kept only when it holds at every length of
  VERIFY_LENGTHS against the torch engine's hidden states (max difference at most
  TOLERANCE times the largest magnitude, at least TOLERANCE): first the fused graph, else
  the plain one, else the engine is refused at load with one line (a family whose Python
  takes a branch on a row's length that the trace froze fails here, never at a request).
* Cache: the kept graph is written under sr.settings.host_cache_dir (`onnx/`), keyed by
  the weights' digest (an adapter's and its base's), config.json, the family, torch's and
  ORT's versions and EXPORT_VERSION; a later load of the same key skips export, fusion
  and verification. `SR_CACHE_DIR=off`: exported at every load into a temporary folder,
  removed once the graph is read into memory.
* Rows: every row is one ORT run, so a row's answer never depends on the rows beside it
  (the worker's batching probe still checks it). The session is made in the process that
  runs it, on its first forward, with intra-op threads = torch's thread count there (the
  worker's `--threads`): a session made before a fork would carry a thread pool the child
  does not have.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import attrs
import numpy as np
import torch

from sr.errors import UnsupportedModel
from sr.models.blocks import Packed

EXTRA_HINT = "pip install 'sr[onnx]'"
EXPORT_VERSION = 2  # raised whenever what is traced changes: a kept graph of another is stale
OPSET = 17
# The trace's row: the model's whole length, up to this. A family's Python may branch on a
# row's length (a sliding window that covers the row, DeBERTa's relative-position table);
# traced at full length, every branch is the general one, right for shorter rows too.
TRACE_TOKENS = 1024
VERIFY_LENGTHS = (1, 2, 5, 17, 77, 200, 513, 1025, 2049)
TOLERANCE = 1e-5


def check_onnxruntime() -> None:
    """UnsupportedModel naming the extra when onnxruntime is not installed. Found, not
    imported: importing it starts a thread, and a fork server must fork with one."""
    if importlib.util.find_spec("onnxruntime") is None:
        raise UnsupportedModel(f"engine onnxruntime needs the onnxruntime package ({EXTRA_HINT})")


def onnxruntime_version() -> str:
    return importlib.metadata.version("onnxruntime")


class _TracedRow(Packed):
    """One row whose length and token types are the traced inputs' (see the module doc)."""

    __slots__ = ("_types",)

    def __init__(self, tokens: int, types: torch.Tensor | None) -> None:
        super().__init__([tokens])
        self._types = types
        if types is not None:
            self.second_starts = [tokens]  # a pair's path, its types from the input

    def second_text_tokens(self, device: torch.device) -> torch.Tensor | None:
        return self._types


class _BackboneGraph(torch.nn.Module):
    """What is exported: a family's hidden states of one row of token ids."""

    def __init__(self, backbone, with_types: bool) -> None:
        super().__init__()
        self.backbone = backbone
        self.with_types = with_types

    def forward(self, ids: torch.Tensor, types: torch.Tensor | None = None) -> torch.Tensor:
        return self.backbone.hidden_states(ids, _TracedRow(ids.shape[0], types))


@attrs.frozen
class ExportedGraph:
    model: Path | bytes  # the kept file, or (with the cache off) the graph itself
    graph: str  # "fused" or "plain"
    source: str  # "exported" or "cached"
    seconds: float  # export, fusion and verification; 0 when cached
    max_difference: float | None  # measured at export against torch; None when cached


def _has_types(backbone) -> bool:
    return getattr(backbone, "token_types", 1) == 2


def cache_key(model, backbone) -> str:
    """The kept graph's name: what the export depends on (module doc, Cache)."""
    adapter = model.adapter
    parts = [
        str(EXPORT_VERSION), str(OPSET), model.weights_sha256,
        adapter.base_weights_sha256 if adapter is not None else "",
        json.dumps(model.layout.config, sort_keys=True), type(backbone).__qualname__,
        torch.__version__, onnxruntime_version(),
    ]  # fmt: skip
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def export_graph(model, backbone, cache_dir: Path | None) -> ExportedGraph:
    """The verified ONNX graph of `model`'s backbone: kept, or made now in a child process
    (sr.models.onnx_export), which imports onnxruntime where this process never does."""
    key = cache_key(model, backbone)
    if cache_dir is None:  # the cache is off: made in a temporary folder, held in memory
        with tempfile.TemporaryDirectory(prefix="sr-onnx-") as folder:
            made = _export_in_child(model, Path(folder) / f"{key}.onnx")
            return attrs.evolve(made, model=made.model.read_bytes())
    folder = cache_dir / "onnx"
    kept, sidecar = folder / f"{key}.onnx", folder / f"{key}.json"
    if kept.exists() and sidecar.exists():
        try:
            graph = json.loads(sidecar.read_text())["graph"]
            return ExportedGraph(kept, graph, "cached", 0.0, None)
        except (OSError, ValueError, KeyError):
            pass  # unreadable: export again
    folder.mkdir(parents=True, exist_ok=True)
    return _export_in_child(model, kept)


def _export_in_child(model, kept: Path) -> ExportedGraph:
    command = [sys.executable, "-m", "sr.models.onnx_export", str(model.artifact_dir), str(kept)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"the export exited {done.returncode}"]
        raise UnsupportedModel(lines[-1].removeprefix("sr.models.onnx_export: "))
    try:
        made = json.loads(done.stdout)
    except ValueError:
        raise UnsupportedModel(
            "engine onnxruntime: the export ended without saying what it made"
        ) from None
    return ExportedGraph(kept, made["graph"], "exported", made["export_s"], made["max_difference"])


def export_verified(backbone, kept: Path) -> dict:
    """Export `backbone`, fuse, verify (module doc) and write the kept graph and its
    sidecar atomically; returns the sidecar's content."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=kept.parent) as work:
        plain = Path(work) / "plain.onnx"
        _export(backbone, plain)
        candidates = [("fused", _fused(plain, Path(work) / "fused.onnx", backbone))]
        candidates.append(("plain", plain))
        failures = []
        for graph, path in candidates:
            if path is None:
                continue
            difference, failure = _verify(path, backbone)
            if failure is None:
                os.replace(path, kept)  # atomic: a reader sees the whole file or none
                made = {
                    "graph": graph,
                    "export_s": round(time.perf_counter() - started, 2),
                    "max_difference": difference,
                }
                _write_atomically(kept.with_suffix(".json"), json.dumps(made))
                return made
            failures.append(f"{graph}: {failure}")
    raise UnsupportedModel(
        f"engine onnxruntime: the exported {type(backbone).__name__} does not match the torch "
        f"engine ({'; '.join(failures)}); serve it with engine torch"
    )


def _write_atomically(path: Path, text: str) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(handle, "w") as out:
        out.write(text)
    os.replace(temporary, path)


@functools.cache
def _silence_exporter() -> None:
    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)


def _export(backbone, path: Path) -> None:
    tokens = min(TRACE_TOKENS, backbone.max_positions)
    ids = torch.randint(
        0, backbone.vocab_size, (tokens,), generator=torch.Generator().manual_seed(0)
    )
    with_types = _has_types(backbone)
    inputs = (ids, torch.zeros_like(ids)) if with_types else (ids,)
    names = ["ids", "types"] if with_types else ["ids"]
    axes = {name: {0: "tokens"} for name in [*names, "hidden"]}
    cut_offs = backbone.__dict__.get("_cut_offs")
    backbone.__dict__["_cut_offs"] = {torch.get_num_threads(): 0}
    try:
        with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                _BackboneGraph(backbone, with_types), inputs, str(path),
                input_names=names, output_names=["hidden"], dynamic_axes=axes,
                opset_version=OPSET, dynamo=False,
            )  # fmt: skip
    except Exception as error:
        raise UnsupportedModel(
            f"engine onnxruntime: {type(backbone).__name__} could not be exported "
            f"({type(error).__name__}: {_first_line(error)})"
        ) from None
    finally:
        if cut_offs is None:
            del backbone.__dict__["_cut_offs"]
        else:
            backbone.__dict__["_cut_offs"] = cut_offs


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def _fused(plain: Path, out: Path, backbone) -> Path | None:
    """`plain` rewritten by ORT's transformer optimizer, or None where it cannot run (the
    `onnx` package it needs is missing, or it fails on this graph)."""
    try:
        from onnxruntime.transformers.optimizer import optimize_model
    except ImportError:
        return None
    _silence_exporter()
    heads = getattr(backbone, "num_heads", 0)
    try:
        optimized = optimize_model(
            str(plain), model_type="bert", num_heads=heads,
            hidden_size=backbone.hidden_size, opt_level=1,
        )  # fmt: skip
        optimized.save_model_to_file(str(out))
    except Exception:  # a pattern the optimizer trips on: the plain graph is still served
        return None
    return out


def _verify(path: Path, backbone) -> tuple[float, str | None]:
    """(largest difference seen, None) when the graph at `path` gives the torch backbone's
    hidden states at every length of VERIFY_LENGTHS that the model takes, else (.., why)."""
    try:
        session = new_session(path, threads=1)
    except Exception as error:  # ORT refuses the graph itself
        return 0.0, f"ORT cannot load it ({type(error).__name__}: {_first_line(error)})"
    generator = torch.Generator().manual_seed(1)
    worst = 0.0
    for length in VERIFY_LENGTHS:
        if length > backbone.max_positions:
            continue
        ids = torch.randint(0, backbone.vocab_size, (length,), generator=generator)
        types = None
        if _has_types(backbone):
            types = torch.zeros_like(ids)
            types[length // 2 :] = 1  # a pair: the second half is the second text
        packed = Packed([length], None if types is None else [length // 2])
        with torch.inference_mode():
            expected = backbone.hidden_states(ids, packed).float().numpy()
        feed = {"ids": ids.numpy()}
        if types is not None:
            feed["types"] = types.numpy()
        try:
            got = session.run(None, feed)[0]
        except Exception as error:
            return worst, f"{length} tokens: {type(error).__name__}"
        if got.shape != expected.shape:
            return worst, f"{length} tokens: shape {got.shape}, expected {expected.shape}"
        difference = float(np.abs(got - expected).max())
        worst = max(worst, difference)
        if not difference <= TOLERANCE * max(1.0, float(np.abs(expected).max())):
            return worst, f"{length} tokens differ by {difference:.2e}"
    return worst, None


def new_session(model: Path | bytes, threads: int):
    """An ORT session on the CPU provider over a graph's file or bytes: `threads` intra-op
    threads, run sequentially."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3  # warnings about unused initialisers are not the caller's
    source = model if isinstance(model, bytes) else str(model)
    return onnxruntime.InferenceSession(source, options, providers=["CPUExecutionProvider"])


class OrtBackbone:
    """A family's backbone whose hidden states ORT computes; all else is the torch one's
    (heads, sizes, the cut-off of the heads' products)."""

    def __init__(self, torch_backbone, exported: ExportedGraph) -> None:
        self._torch = torch_backbone
        self.exported = exported
        self._with_types = _has_types(torch_backbone)
        self._session = None
        self._session_pid: int | None = None
        self._threads: int | None = None

    def __getattr__(self, name: str):
        # Only reached for what OrtBackbone does not define: the torch backbone's heads,
        # sizes and calibration.
        return getattr(self._torch, name)

    def _run(self, feed: dict) -> np.ndarray:
        pid = os.getpid()
        if self._session_pid != pid:
            self._threads = torch.get_num_threads()
            self._session = new_session(self.exported.model, self._threads)
            self._session_pid = pid
        return self._session.run(None, feed)[0]

    def _row(self, ids: np.ndarray, types: np.ndarray | None) -> np.ndarray:
        """One row's last hidden states [L, H]; its tokens of type 0 where the family has
        types and none are given."""
        feed = {"ids": ids}
        if self._with_types:
            feed["types"] = np.zeros_like(ids) if types is None else types
        return self._run(feed)

    def hidden_rows(self, batch: list[list[int]]) -> list[np.ndarray]:
        """Each row's last hidden states, float32 [L, H], one ORT run per row, one text a
        row: the embedding path, without a torch operator."""
        return [self._row(np.array(row, dtype=np.int64), None) for row in batch]

    def hidden_states(self, ids: torch.Tensor, packed: Packed) -> torch.Tensor:
        """Last hidden states [T, H] of packed token ids [T], one ORT run per row."""
        flat = ids.cpu().numpy()
        types = packed.second_text_tokens(ids.device) if self._with_types else None
        types_flat = None if types is None else types.cpu().numpy()
        rows = [
            self._row(flat[start:end], None if types_flat is None else types_flat[start:end])
            for start, end in zip(packed.starts, packed.starts[1:], strict=False)
        ]
        hidden = rows[0] if len(rows) == 1 else np.concatenate(rows)
        return torch.from_numpy(hidden)

    def card(self) -> dict:
        card = {
            "name": "onnxruntime",
            "version": onnxruntime_version(),
            "graph": self.exported.graph,
            "export": self.exported.source,
            "rows": "one per run: a row's answer never depends on the rows beside it",
        }
        if self.exported.source == "exported":
            card["export_s"] = self.exported.seconds
            card["max_difference"] = self.exported.max_difference
        if self._threads is not None:
            card["threads"] = self._threads
        return card
