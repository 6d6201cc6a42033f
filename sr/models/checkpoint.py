"""What a checkpoint folder says about itself: config.json and the sentence-transformers
module files (modules.json, <pooling>/config.json, Normalize, sentence_bert_config.json).

Only the module chain Transformer -> Pooling -> [Normalize] is served; a checkpoint with
other modules (Dense, ...) is refused rather than served with a different answer.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs

from sr.errors import UnsupportedModel

POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len", "weightedmean", "lasttoken")
# The order sentence-transformers concatenates pooled vectors in when several modes are on.
_POOLING_KEYS = {
    "cls": "pooling_mode_cls_token",
    "max": "pooling_mode_max_tokens",
    "mean": "pooling_mode_mean_tokens",
    "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens",
    "weightedmean": "pooling_mode_weightedmean_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}
_ST = "sentence_transformers.models."


@attrs.frozen
class CheckpointLayout:
    config: dict
    model_type: str
    pooling_modes: tuple[str, ...]  # concatenated in this order
    normalize: bool
    max_seq_length: int | None  # sentence_bert_config.json's own limit, if any
    head_labels: tuple[str, ...] | None


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UnsupportedModel(f"{path}: cannot be read as JSON: {exc}") from exc


def _pooling_modes(folder: Path, pooling_path: str) -> tuple[str, ...]:
    config = _read_json(folder / pooling_path / "config.json")
    if not isinstance(config, dict):
        raise UnsupportedModel(f"{folder / pooling_path / 'config.json'}: not an object")
    modes = tuple(m for m in POOLING_MODES if config.get(_POOLING_KEYS[m]))
    if not modes:
        raise UnsupportedModel(f"{folder / pooling_path}: no supported pooling mode is on")
    if config.get("include_prompt") is False:
        raise UnsupportedModel(f"{folder / pooling_path}: include_prompt=false is not supported")
    return modes


def _module_chain(folder: Path) -> tuple[tuple[str, ...], bool]:
    """(pooling modes, normalize) from modules.json; mean pooling when there is none."""
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        # What sentence-transformers itself builds around a plain encoder checkpoint.
        return ("mean",), False
    modules = _read_json(modules_file)
    if not isinstance(modules, list):
        raise UnsupportedModel(f"{modules_file}: not a list")
    modes: tuple[str, ...] | None = None
    normalize = False
    for module in sorted(modules, key=lambda m: m.get("idx", 0)):
        kind = str(module.get("type", "")).removeprefix(_ST)
        if kind == "Transformer" and modes is None:
            continue
        if kind == "Pooling" and modes is None:
            modes = _pooling_modes(folder, module.get("path", ""))
        elif kind == "Normalize" and modes is not None and not normalize:
            normalize = True
        else:
            raise UnsupportedModel(
                f"{modules_file}: module {module.get('type')!r} at position {module.get('idx')} "
                "is not supported (sr serves Transformer -> Pooling -> [Normalize])"
            )
    return modes or ("mean",), normalize


def _head_labels(config: dict) -> tuple[str, ...] | None:
    """Labels in output order from id2label, or None when config.json names none."""
    if not config.get("id2label"):
        return None
    id2label = config.get("id2label") or {}
    try:
        ordered = sorted(((int(k), str(v)) for k, v in id2label.items()))
    except (TypeError, ValueError) as exc:
        raise UnsupportedModel(f"config.json id2label has a non-integer key: {exc}") from exc
    if not ordered or [i for i, _ in ordered] != list(range(len(ordered))):
        raise UnsupportedModel("config.json id2label must number labels 0..n-1")
    return tuple(label for _, label in ordered)


def read_layout(folder: Path) -> CheckpointLayout:
    config = _read_json(folder / "config.json")
    if not isinstance(config, dict):
        raise UnsupportedModel(f"{folder / 'config.json'}: not an object")
    model_type = str(config.get("model_type", ""))
    modes, normalize = _module_chain(folder)
    max_seq_length = None
    sbert_file = folder / "sentence_bert_config.json"
    if sbert_file.is_file():
        sbert = _read_json(sbert_file)
        if isinstance(sbert, dict) and isinstance(sbert.get("max_seq_length"), int):
            max_seq_length = sbert["max_seq_length"]
    return CheckpointLayout(
        config=config,
        model_type=model_type,
        pooling_modes=modes,
        normalize=normalize,
        max_seq_length=max_seq_length,
        head_labels=_head_labels(config),
    )
