"""Which folders are SPLADE sparse encoders: sentence-transformers' SparseEncoder folders
(an MLM transformer, then SpladePooling), and their pooling settings. Torch-free (the router
reads folders too); the head itself is sr.models.splade.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs

from sr.errors import UnsupportedModel
from sr.models.json_file import read_json_object

POOLING_STRATEGIES = ("max", "sum")
ACTIVATIONS = ("relu", "log1p_relu")
# modules.json `type`s, by their class name (sentence-transformers moved the classes
# between releases: sparse_encoder.models.*, sparse_encoder.modules.<module>.*).
_MLM_MODULES = frozenset({"MLMTransformer"})
_SPLADE_POOLING = "SpladePooling"
_FILL_MASK = "fill-mask"  # sentence-transformers 5.4+: a Transformer with this task


@attrs.frozen
class SparseSpec:
    pooling: str  # "max" or "sum"
    activation: str  # "relu" or "log1p_relu"
    max_active_dims: int | None  # keep only this many of a row's largest values

    def card(self) -> dict:
        return {
            "pooling": self.pooling,
            "activation": self.activation,
            "max_active_dims": self.max_active_dims,
        }


def _class_name(module: dict) -> str:
    return str(module.get("type", "")).rsplit(".", 1)[-1]


def read_sparse_chain(folder: Path) -> SparseSpec | None:
    """The folder's SpladePooling settings when modules.json is a SparseEncoder's (an MLM
    transformer then SpladePooling, nothing else); None for any other folder."""
    folder = Path(folder)
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return None
    try:
        modules = json.loads(modules_file.read_text())
    except (OSError, ValueError):
        return None  # read_layout reports it
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        return None
    names = [_class_name(m) for m in sorted(modules, key=lambda m: m.get("idx", 0))]
    if _SPLADE_POOLING not in names:
        return None
    chain = sorted(modules, key=lambda m: m.get("idx", 0))
    first_is_mlm = names[0] in _MLM_MODULES or (
        names[0] == "Transformer" and _transformer_task(folder, chain[0]) == _FILL_MASK
    )
    if len(names) != 2 or not first_is_mlm or names[1] != _SPLADE_POOLING:
        raise UnsupportedModel(
            f"{modules_file}: modules {names} are not supported (sr serves sparse encoders "
            "as MLMTransformer -> SpladePooling)"
        )
    pooling_file = folder / str(chain[1].get("path", "")) / "config.json"
    config = read_json_object(pooling_file) if pooling_file.is_file() else {}
    pooling = config.get("pooling_strategy", "max")
    activation = config.get("activation_function", "relu")
    if pooling not in POOLING_STRATEGIES:
        raise UnsupportedModel(
            f"{pooling_file}: pooling_strategy {pooling!r} is not one of {POOLING_STRATEGIES}"
        )
    if activation not in ACTIVATIONS:
        raise UnsupportedModel(
            f"{pooling_file}: activation_function {activation!r} is not one of {ACTIVATIONS}"
        )
    return SparseSpec(pooling, activation, _max_active_dims(folder))


def _transformer_task(folder: Path, module: dict) -> str | None:
    path = folder / str(module.get("path", "")) / "sentence_bert_config.json"
    return read_json_object(path).get("transformer_task") if path.is_file() else None


def _max_active_dims(folder: Path) -> int | None:
    path = folder / "config_sentence_transformers.json"
    if not path.is_file():
        return None
    value = read_json_object(path).get("max_active_dims")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UnsupportedModel(f"{path}: max_active_dims must be a positive integer, got {value!r}")
    return value
