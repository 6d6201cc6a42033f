"""What a checkpoint folder says about itself: config.json and the sentence-transformers
module files (modules.json, <pooling>/config.json, <dense>/config.json, Normalize,
sentence_bert_config.json).

Only the module chain Transformer -> Pooling -> Dense* -> [Normalize] is served, in
sentence-transformers' order; a checkpoint with other modules (CNN, LSTM, LayerNorm, ...) or
these in another order is refused rather than served with a different answer. Dense weights
are only located here (sr.models.dense loads them once the pooled size is known).
"""

from __future__ import annotations

from pathlib import Path

import attrs

from sr.errors import UnsupportedModel
from sr.models.json_file import read_json, read_json_object
from sr.models.prompts import Prompts, read_prompts
from sr.models.sparse import SparseSpec, read_sparse_chain

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
_SENTENCE_EMBEDDING = "sentence_embedding"

# Dense activation_function values (what sentence-transformers writes: the class's full
# name) -> the activation's name in sr.models.dense. Only these plain torch.nn modules are
# served; any other name is refused at load.
DENSE_ACTIVATIONS = {
    f"{module}.{name}": name
    for name, modules in {
        "Identity": ("torch.nn", "torch.nn.modules.linear"),
        "Tanh": ("torch.nn", "torch.nn.modules.activation"),
        "ReLU": ("torch.nn", "torch.nn.modules.activation"),
        "GELU": ("torch.nn", "torch.nn.modules.activation"),
        "Sigmoid": ("torch.nn", "torch.nn.modules.activation"),
        "SiLU": ("torch.nn", "torch.nn.modules.activation"),
    }.items()
    for module in modules
}


@attrs.frozen
class DenseSpec:
    """One sentence_transformers.models.Dense module: activation(x @ W.T + b) [+ x]."""

    path: str  # its folder, relative to the checkpoint; weights in <path>/model.safetensors
    in_features: int
    out_features: int
    bias: bool
    activation: str  # a DENSE_ACTIVATIONS value
    residual: bool  # use_residual: x (or x @ residual.weight.T) added after the activation


@attrs.frozen
class CheckpointLayout:
    config: dict
    model_type: str
    pooling_modes: tuple[str, ...]  # concatenated in this order
    normalize: bool
    max_seq_length: int | None  # sentence_bert_config.json's own limit, if any
    head_labels: tuple[str, ...] | None
    dense: tuple[DenseSpec, ...] = ()  # applied in this order after pooling, before Normalize
    # A sentence-transformers folder (modules.json): its bare model is what
    # sentence-transformers loads, whatever config.json's `architectures` names.
    sentence_transformers: bool = False
    # config_sentence_transformers.json's prompts (sr.models.prompts) and whether the
    # Pooling counts a prompt's tokens (`include_prompt`).
    prompts: Prompts = attrs.field(factory=Prompts)
    include_prompt: bool = True
    # A SparseEncoder folder (MLM head + SpladePooling): its answers are sparse vectors over
    # the vocabulary (sr.models.sparse), and the fields above about pooling do not apply.
    sparse: SparseSpec | None = None


def _pooling_modes(folder: Path, pooling_path: str) -> tuple[tuple[str, ...], bool]:
    config = read_json_object(folder / pooling_path / "config.json")
    modes = tuple(m for m in POOLING_MODES if config.get(_POOLING_KEYS[m]))
    if not modes:
        raise UnsupportedModel(f"{folder / pooling_path}: no supported pooling mode is on")
    # include_prompt=false drops a prompt's tokens from pooling (sr.models.prompts); a text
    # embedded without a prompt pools every token either way.
    include_prompt = config.get("include_prompt", True)
    if not isinstance(include_prompt, bool):
        raise UnsupportedModel(
            f"{folder / pooling_path / 'config.json'}: include_prompt must be true or false"
        )
    return modes, include_prompt


def _dense(folder: Path, path: str) -> DenseSpec:
    if not path:
        raise UnsupportedModel(f"{folder / 'modules.json'}: a Dense module has no path")
    config_file = folder / path / "config.json"
    config = read_json_object(config_file)

    def features(key: str) -> int:
        value = config.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UnsupportedModel(
                f"{config_file}: {key} must be a positive integer, got {value!r}"
            )
        return value

    def flag(key: str, default: bool) -> bool:
        value = config.get(key, default)
        if not isinstance(value, bool):
            raise UnsupportedModel(f"{config_file}: {key} must be true or false, got {value!r}")
        return value

    for key in ("module_input_name", "module_output_name"):
        if config.get(key) not in (None, _SENTENCE_EMBEDDING):
            raise UnsupportedModel(
                f"{config_file}: {key}={config[key]!r} is not supported (sr applies Dense "
                f"to the pooled {_SENTENCE_EMBEDDING!r} only)"
            )
    # sentence-transformers' default when the key is absent is Tanh.
    name = config.get("activation_function", "torch.nn.modules.activation.Tanh")
    activation = DENSE_ACTIVATIONS.get(name) if isinstance(name, str) else None
    if activation is None:
        supported = ", ".join(sorted(set(DENSE_ACTIVATIONS.values())))
        raise UnsupportedModel(
            f"{config_file}: activation_function {name!r} is not supported "
            f"(supported: torch.nn {supported})"
        )
    weights = folder / path / "model.safetensors"
    if not weights.is_file():
        if (folder / path / "pytorch_model.bin").is_file():
            raise UnsupportedModel(
                f"{folder / path / 'pytorch_model.bin'}: sr loads only safetensors weights; "
                f"convert the Dense weights to {weights.name}"
            )
        raise UnsupportedModel(f"{folder / path}: the Dense module has no {weights.name}")
    return DenseSpec(
        path=path,
        in_features=features("in_features"),
        out_features=features("out_features"),
        bias=flag("bias", True),
        activation=activation,
        residual=flag("use_residual", False),
    )


def _check_normalize(folder: Path, path: str) -> None:
    """A Normalize that L2-normalises the sentence embedding (its config, if any, says so)."""
    config_file = folder / path / "config.json"
    if not path or not config_file.is_file():
        return
    config = read_json_object(config_file)
    for key in ("module_input_name", "module_output_name"):
        if config.get(key) not in (None, _SENTENCE_EMBEDDING):
            raise UnsupportedModel(
                f"{config_file}: {key}={config[key]!r} is not supported (sr normalises the "
                f"{_SENTENCE_EMBEDDING!r} only)"
            )


def _module_chain(folder: Path) -> tuple[tuple[str, ...], tuple[DenseSpec, ...], bool, bool]:
    """(pooling modes, Dense modules, normalize, include_prompt) from modules.json; mean
    pooling when there is none."""
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        # What sentence-transformers itself builds around a plain encoder checkpoint.
        return ("mean",), (), False, True
    modules = read_json(modules_file)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise UnsupportedModel(f"{modules_file}: not a list of objects")
    modes: tuple[str, ...] | None = None
    include_prompt = True
    dense: list[DenseSpec] = []
    normalize = False
    for module in sorted(modules, key=lambda m: m.get("idx", 0)):
        kind = str(module.get("type", "")).removeprefix(_ST)
        path = str(module.get("path", ""))
        if kind == "Transformer" and modes is None:
            continue
        if kind == "Pooling" and modes is None:
            modes, include_prompt = _pooling_modes(folder, path)
        elif kind == "Dense" and modes is not None and not normalize:
            spec = _dense(folder, path)
            if dense and spec.in_features != dense[-1].out_features:
                raise UnsupportedModel(
                    f"{folder / path / 'config.json'}: in_features {spec.in_features} does not "
                    f"match the previous Dense's out_features {dense[-1].out_features}"
                )
            dense.append(spec)
        elif kind == "Normalize" and modes is not None and not normalize:
            _check_normalize(folder, path)
            normalize = True
        else:
            raise UnsupportedModel(
                f"{modules_file}: module {module.get('type')!r} at position {module.get('idx')} "
                "is not supported (sr serves Transformer -> Pooling -> Dense* -> [Normalize])"
            )
    return modes or ("mean",), tuple(dense), normalize, include_prompt


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
    config = read_json_object(folder / "config.json")
    model_type = str(config.get("model_type", ""))
    sparse = read_sparse_chain(folder)
    if sparse is None:
        modes, dense, normalize, include_prompt = _module_chain(folder)
    else:  # SpladePooling pools the vocabulary's logits, not hidden states
        modes, dense, normalize, include_prompt = (), (), False, True
    max_seq_length = None
    sbert_file = folder / "sentence_bert_config.json"
    if sbert_file.is_file():
        sbert = read_json(sbert_file)
        if isinstance(sbert, dict) and isinstance(sbert.get("max_seq_length"), int):
            max_seq_length = sbert["max_seq_length"]
    return CheckpointLayout(
        config=config,
        model_type=model_type,
        pooling_modes=modes,
        normalize=normalize,
        max_seq_length=max_seq_length,
        head_labels=_head_labels(config),
        dense=dense,
        sentence_transformers=(folder / "modules.json").is_file(),
        prompts=read_prompts(folder),
        include_prompt=include_prompt,
        sparse=sparse,
    )
