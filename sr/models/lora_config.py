"""A LoRA adapter folder's adapter_config.json, read once, and peft's rules for which
modules it adapts. No torch here: `sr serve --download` reads an adapter's base through it.

An adapter folder holds adapter_config.json and adapter_model.safetensors, and neither
config.json nor model.safetensors (a folder with both is a model folder). Its base is
`base_model_name_or_path` (at `revision`, if any), resolved like any artifact.

Rules (peft's, reimplemented; peft is never imported):
* Served: `peft_type` LORA; `task_type` SEQ_CLS, FEATURE_EXTRACTION or none; `r`,
  `lora_alpha`, `use_rslora` (scale alpha / sqrt(r), else alpha / r), `rank_pattern` and
  `alpha_pattern` (per-module r and alpha, matched as peft's `get_pattern_key` matches),
  `target_modules` (a list: a module whose name is an entry or ends with `.entry`; a
  string: a regex the whole name must match; "all-linear"), `exclude_modules`,
  `layers_to_transform` / `layers_pattern`, `modules_to_save` (full tensors replacing
  the base's), `lora_bias` (added to the layer's bias), `bias` (none, lora_only, all: the
  trained biases the adapter saves replace the base's).
* `fan_in_fan_out` is read and, as peft does for `torch.nn.Linear` layers (every layer
  sr merges into), treated as false: the merged product is B @ A either way.
* Keys that only steer training (dropout, inference mode, versions, init of plain LoRA)
  are ignored. Anything else that is set (DoRA, aLoRA, QA-LoRA, trainable tokens,
  target_parameters, an init that rewrites the base's weights, a key sr does not know)
  is refused at load with one line naming it: sr never serves a different answer.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import attrs

from sr.errors import UnsupportedModel
from sr.models.json_file import read_json_object

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MODEL_FILES = ("config.json", "model.safetensors")
TASK_TYPES = ("SEQ_CLS", "FEATURE_EXTRACTION")
ALL_LINEAR = "all-linear"
# bias: "none" keeps the base's biases; "lora_only" saves the trained biases of adapted
# layers, "all" of every layer; either way they replace the base's.
BIAS_MODES = ("none", "lora_only", "all")

# Keys sr reads (below) and keys that only matter while training, whatever their value.
_READ = {
    "peft_type", "task_type", "base_model_name_or_path", "revision", "r", "lora_alpha",
    "use_rslora", "target_modules", "exclude_modules", "modules_to_save", "rank_pattern",
    "alpha_pattern", "layers_to_transform", "layers_pattern", "fan_in_fan_out", "bias",
    "lora_bias", "init_lora_weights", "auto_mapping",
}  # fmt: skip
_TRAINING_ONLY = {
    "lora_dropout", "inference_mode", "peft_version", "megatron_core", "runtime_config",
    "qalora_group_size", "eva_config", "corda_config", "lora_ga_config",
}  # fmt: skip
# init_lora_weights values that only choose A and B's starting values; the others
# (pissa, olora, corda, lora_ga, loftq, mica) rewrite the base's weights or are variants.
_PLAIN_INITS = (True, False, "gaussian", "orthogonal", "eva")


def is_adapter_folder(folder: Path) -> bool:
    """A LoRA adapter folder: adapter_config.json without a model of its own."""
    return (folder / ADAPTER_CONFIG).is_file() and not all(
        (folder / name).is_file() for name in MODEL_FILES
    )


def adapter_folder_problem(folder: Path) -> str | None:
    """Why an adapter folder cannot be served as one, or None."""
    if (folder / ADAPTER_WEIGHTS).is_file():
        return None
    if (folder / "adapter_model.bin").is_file():
        return f"is a LoRA adapter with adapter_model.bin; sr loads only {ADAPTER_WEIGHTS}"
    return f"is a LoRA adapter ({ADAPTER_CONFIG}) but lacks {ADAPTER_WEIGHTS}"


@attrs.frozen
class LoraSpec:
    """What sr serves of one adapter_config.json."""

    base: str  # base_model_name_or_path: an absolute path or a repository ID
    base_revision: str | None
    task_type: str | None
    r: int
    alpha: float
    use_rslora: bool
    target_modules: tuple[str, ...] | str
    exclude_modules: tuple[str, ...] | str | None
    modules_to_save: tuple[str, ...]
    rank_pattern: dict[str, int]
    alpha_pattern: dict[str, float]
    layers_to_transform: tuple[int, ...] | None
    layers_pattern: tuple[str, ...]
    lora_bias: bool
    bias: str  # one of BIAS_MODES
    fan_in_fan_out: bool
    trained_on: str | None  # the base's module as auto_mapping names it, if it does

    def targets(self, name: str) -> bool:
        """Whether peft puts LoRA on the module `name` (its name in the trained model),
        as peft's check_target_module_exists decides; "all-linear" is expanded by caller."""
        if _matches_any(self.exclude_modules, name):
            return False
        # A module peft saves whole is never also adapted.
        if any(re.match(rf"(^|.*\.){m}($|\..*)", name) for m in self.modules_to_save):
            return False
        if isinstance(self.target_modules, str):
            return re.fullmatch(self.target_modules, name) is not None
        if name in self.target_modules:
            return True
        if not any(name.endswith(f".{t}") for t in self.target_modules):
            return False
        if self.layers_to_transform is None:
            return True
        index = _layer_index(name, self.layers_pattern)
        return index is not None and index in self.layers_to_transform

    def saved_whole(self, name: str) -> bool:
        """Whether a module of this name is one of modules_to_save (peft: a suffix match)."""
        return any(name.endswith(m) for m in self.modules_to_save)

    def scale(self, name: str) -> tuple[int, float]:
        """(r, scale) of the module `name`: its rank_pattern / alpha_pattern entry, if any."""
        r = self.rank_pattern.get(_pattern_key(self.rank_pattern, name), self.r)
        alpha = self.alpha_pattern.get(_pattern_key(self.alpha_pattern, name), self.alpha)
        return r, alpha / math.sqrt(r) if self.use_rslora else alpha / r

    def card(self) -> dict:
        targets = self.target_modules
        return {
            "peft_type": "LORA",
            "task_type": self.task_type,
            "r": self.r,
            "lora_alpha": self.alpha,
            "use_rslora": self.use_rslora,
            "target_modules": targets if isinstance(targets, str) else list(targets),
            "modules_to_save": list(self.modules_to_save),
            "bias": self.bias,
        }


def _is_all_linear(targets) -> bool:
    return isinstance(targets, str) and targets.lower() == ALL_LINEAR


def _matches_any(names: tuple[str, ...] | str | None, name: str) -> bool:
    if not names:
        return False
    if isinstance(names, str):
        return re.fullmatch(names, name) is not None
    return name in names or any(name.endswith(f".{n}") for n in names)


def _layer_index(name: str, patterns: tuple[str, ...]) -> int | None:
    """The layer number in a module name, as peft finds it for layers_to_transform."""
    if not patterns:
        match = re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", name)
    else:
        match = None
        for pattern in patterns:
            match = re.match(rf"(?:^|.*?\.){pattern}\.(?P<idx>\d+)\.", name)
            if match is not None:
                break
    return int(match.group("idx")) if match else None


def _pattern_key(patterns: dict, name: str) -> str:
    for key in patterns:
        if re.match(rf"(.*\.)?({key})$", name):
            return key
    return name


def _names(value, key: str, where: Path) -> tuple[str, ...] | str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise UnsupportedModel(f"{where}: {key} must be a list of names or a regex, got {value!r}")


def _number(config: dict, key: str, where: Path, default=None) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise UnsupportedModel(f"{where}: {key} must be a positive number, got {value!r}")
    return value


def read_lora_config(folder: Path) -> LoraSpec:
    """adapter_config.json of an adapter folder; UnsupportedModel naming what is not served."""
    where = folder / ADAPTER_CONFIG
    config = read_json_object(where)
    peft_type = config.get("peft_type")
    if peft_type != "LORA":
        raise UnsupportedModel(f"{where}: peft_type {peft_type!r} is not served (only LORA)")
    task = config.get("task_type")
    if task not in (None, *TASK_TYPES):
        raise UnsupportedModel(
            f"{where}: task_type {task!r} is not served (served: {', '.join(TASK_TYPES)})"
        )
    if config.get("use_dora"):
        raise UnsupportedModel(f"{where}: use_dora (DoRA) is not served; sr merges plain LoRA")
    for key, value in config.items():
        if key in _READ or key in _TRAINING_ONLY or value in (None, False, [], {}, ""):
            continue
        raise UnsupportedModel(
            f"{where}: {key}={value!r} is not served (sr merges plain LoRA into linear layers)"
        )
    init = config.get("init_lora_weights", True)
    if init not in _PLAIN_INITS:
        raise UnsupportedModel(
            f"{where}: init_lora_weights={init!r} is not served (it rewrites the base's weights"
            " or is a LoRA variant; convert the adapter to plain LoRA)"
        )
    bias = config.get("bias", "none")
    if bias not in BIAS_MODES:
        raise UnsupportedModel(
            f"{where}: bias={bias!r} is not served (served: {', '.join(BIAS_MODES)})"
        )
    base = config.get("base_model_name_or_path")
    if not isinstance(base, str) or not base:
        raise UnsupportedModel(f"{where}: base_model_name_or_path names no base model")
    revision = config.get("revision")
    targets = _names(config.get("target_modules"), "target_modules", where)
    if not targets:
        raise UnsupportedModel(f"{where}: target_modules names no module")
    layers = config.get("layers_to_transform")
    if isinstance(layers, int) and not isinstance(layers, bool):
        layers = [layers]
    if layers is not None and (
        not isinstance(layers, list) or not all(isinstance(i, int) for i in layers)
    ):
        raise UnsupportedModel(f"{where}: layers_to_transform must be layer numbers")
    if layers is not None and isinstance(targets, str):
        layers = None  # peft applies it to a list of names only
    pattern = config.get("layers_pattern") or ()
    r = _number(config, "r", where, 8)
    if not isinstance(r, int):
        raise UnsupportedModel(f"{where}: r must be an integer, got {r!r}")
    for key in ("rank_pattern", "alpha_pattern"):
        if not isinstance(config.get(key) or {}, dict):
            raise UnsupportedModel(f"{where}: {key} must be an object")
    saved = _names(config.get("modules_to_save"), "modules_to_save", where)
    if isinstance(saved, str):
        saved = (saved,)
    trained_on = None
    mapping = config.get("auto_mapping")
    if isinstance(mapping, dict) and isinstance(mapping.get("parent_library"), str):
        trained_on = mapping["parent_library"]
    return LoraSpec(
        base=base,
        base_revision=revision if isinstance(revision, str) and revision else None,
        task_type=task,
        r=r,
        alpha=_number(config, "lora_alpha", where, 8),
        use_rslora=bool(config.get("use_rslora", False)),
        target_modules=ALL_LINEAR if _is_all_linear(targets) else targets,
        exclude_modules=_names(config.get("exclude_modules"), "exclude_modules", where),
        modules_to_save=tuple(saved or ()),
        rank_pattern=dict(config.get("rank_pattern") or {}),
        alpha_pattern=dict(config.get("alpha_pattern") or {}),
        layers_to_transform=tuple(layers) if layers is not None else None,
        layers_pattern=(pattern,) if isinstance(pattern, str) else tuple(pattern),
        lora_bias=bool(config.get("lora_bias", False)),
        bias=bias,
        fan_in_fan_out=bool(config.get("fan_in_fan_out", False)),
        trained_on=trained_on,
    )


def adapter_base(folder: Path) -> tuple[str, str | None] | None:
    """(base artifact, its revision) of an adapter folder, or None for a model folder (or
    an adapter config that names no base: loading reports it)."""
    if not is_adapter_folder(folder):
        return None
    try:
        spec = read_lora_config(folder)
    except UnsupportedModel:
        return None
    return spec.base, spec.base_revision
