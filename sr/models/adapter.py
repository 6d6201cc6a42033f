"""A LoRA adapter served as its base model with the adapter merged into the weights.

`open_adapter(folder)` reads an adapter folder (sr.models.lora_config), resolves its base
like any artifact (sr.models.artifacts: a local path, SR_MODEL_DIR, the hub cache) and
returns an `Adapter` whose `merged_weights()` are the base's safetensors weights with, for
every module peft adapts, W' = W + scale * B @ A (what peft's `merge_and_unload` computes,
in float32), and the adapter's `modules_to_save` tensors in place of the base's. The
family then builds its layers from those weights as from any checkpoint, so a forward
costs exactly what the base's costs.

Rules:
* Names: peft names modules as the model it wrapped did (`bert.encoder.layer.0...` for a
  `*ForSequenceClassification`, `encoder.layer.0...` for a bare `BertModel`); sr reads the
  base's weights without the family's prefix. The adapter's own tensor names say which
  naming it was trained under; a name for another family's prefix is refused as an
  adapter of another model type.
* Only the linear layers a family computes take LoRA (`FAMILY_LINEARS`); a target that
  names no such layer, an adapter tensor for a module the base does not have, shapes that
  do not fit, or a SEQ_CLS adapter whose model would have no classifier are refused at
  load with one line.
* Unadapted tensors stay views of the base's file pages (shared by every process that maps
  the file); merged and replaced ones are private to the process that merged them.
* Labels: the adapter folder's config.json (`id2label`, `label2id`, `problem_type`) when
  it has one, else the base's when their count matches the classifier's outputs, else
  Hugging Face's `LABEL_i`. The tokenizer: the adapter's tokenizer.json, else the base's.
"""

from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path

import attrs
import torch
from safetensors.torch import load_file

from sr.errors import ArtifactNotFound, UnsupportedModel
from sr.models.artifacts import resolve_artifact
from sr.models.blocks import strip_prefix
from sr.models.checkpoint import CheckpointLayout, _head_labels, read_layout
from sr.models.json_file import read_json_object
from sr.models.lora_config import (
    ADAPTER_WEIGHTS,
    ALL_LINEAR,
    LoraSpec,
    is_adapter_folder,
    read_lora_config,
)
from sr.settings import ModelSources

PEFT_PREFIX = "base_model.model."
_LORA_PARTS = ("lora_A.weight", "lora_B.weight", "lora_B.bias")
_LABEL_KEYS = ("id2label", "label2id", "problem_type")


@attrs.frozen
class FamilyLinears:
    """Where a family's linear layers are, by Hugging Face name without `prefix`."""

    prefix: str  # the backbone's attribute in transformers' task models, with the dot
    linear: str  # regex of the linear layers' module names (without the prefix)
    heads: tuple[str, ...]  # task-model modules outside the prefix (the classifier)
    head_out: str  # the tensor a sequence-classification head ends with


_BERT_LAYERS = (
    r"encoder\.layer\.\d+\.(attention\.self\.(query|key|value)|attention\.output\.dense"
    r"|intermediate\.dense|output\.dense)"
)
_ROBERTA = FamilyLinears(
    "roberta.", _BERT_LAYERS + r"|classifier(\.dense|\.out_proj)?", ("classifier",),
    "classifier.out_proj.weight",
)  # fmt: skip
FAMILY_LINEARS: dict[str, FamilyLinears] = {
    "bert": FamilyLinears(
        "bert.", _BERT_LAYERS + r"|pooler\.dense|classifier", ("classifier",), "classifier.weight"
    ),
    "roberta": _ROBERTA,
    "xlm-roberta": _ROBERTA,
    "modernbert": FamilyLinears(
        "model.",
        r"layers\.\d+\.(attn\.(Wqkv|Wo)|mlp\.(Wi|Wo))|head\.dense|classifier",
        ("head", "classifier"),
        "classifier.weight",
    ),
}
# Backbone prefixes of transformers' task models, to name the model type an adapter
# was trained on when its tensors do not fit the base.
_PREFIX_TYPES = {"bert.": "bert", "roberta.": "roberta", "model.": "modernbert",
                 "mpnet.": "mpnet", "deberta.": "deberta", "distilbert.": "distilbert",
                 "electra.": "electra"}  # fmt: skip


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as weights:
        for chunk in iter(lambda: weights.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@attrs.define(eq=False)
class Adapter:
    """One adapter folder on its resolved base (`open_adapter`)."""

    folder: Path
    spec: LoraSpec
    base_dir: Path
    layout: CheckpointLayout  # the base's, with the adapter's labels
    merged: list[str] = attrs.field(factory=list)  # modules given W + scale * B @ A
    replaced: list[str] = attrs.field(factory=list)  # tensors taken whole from the adapter
    scales: set[float] = attrs.field(factory=set)

    @property
    def tokenizer_dir(self) -> Path:
        return self.folder if (self.folder / "tokenizer.json").is_file() else self.base_dir

    @functools.cached_property
    def weights_sha256(self) -> str:
        return file_sha256(self.folder / ADAPTER_WEIGHTS)

    @functools.cached_property
    def base_weights_sha256(self) -> str:
        return file_sha256(self.base_dir / "model.safetensors")

    def card(self) -> dict:
        """The worker card's `adapter` entry: the adapter, its base and what was merged."""
        scales = sorted(self.scales)
        return {
            "path": str(self.folder),
            "weights_sha256": self.weights_sha256,
            **self.spec.card(),
            "scale": scales[0] if len(scales) == 1 else scales,
            "merged_modules": len(self.merged),
            "replaced_tensors": len(self.replaced),
            "base": {
                "artifact": self.spec.base,
                "revision": self.spec.base_revision,
                "path": str(self.base_dir),
                "weights_sha256": self.base_weights_sha256,
            },
        }

    def merged_weights(self) -> dict[str, torch.Tensor]:
        """The base's weights (without the family's prefix) with the adapter merged in."""
        weights = load_file(str(self.base_dir / "model.safetensors"), device="cpu")
        tensors = load_file(str(self.folder / ADAPTER_WEIGHTS), device="cpu")
        self.merged, self.replaced, self.scales = [], [], set()
        return _merge(self, weights, tensors)


def open_adapter(folder: Path, *, sources: ModelSources | None = None) -> Adapter | None:
    """The adapter in `folder` on its base, or None when `folder` is a model folder.
    ArtifactNotFound when the base does not resolve; UnsupportedModel for what is refused."""
    if not is_adapter_folder(folder):
        return None
    spec = read_lora_config(folder)
    try:
        base_dir = resolve_artifact(spec.base, spec.base_revision, sources=sources)
    except ArtifactNotFound as error:
        raise ArtifactNotFound(f"the base of the adapter {folder}: {error}") from None
    if is_adapter_folder(base_dir):
        raise UnsupportedModel(
            f"{folder}: its base {spec.base!r} is itself an adapter; sr serves one adapter on a"
            " model folder"
        )
    layout = read_layout(base_dir)
    if layout.model_type not in FAMILY_LINEARS:
        raise UnsupportedModel(
            f"{folder}: LoRA adapters are served on {', '.join(FAMILY_LINEARS)} bases, not on"
            f" model_type {layout.model_type!r}"
        )
    _check_model_type(folder, spec, layout.model_type)
    return Adapter(folder, spec, base_dir, _with_labels(folder, _task_decides(layout)))


def _task_decides(layout: CheckpointLayout) -> CheckpointLayout:
    """The base's config.json without `architectures`: the class it names is the base's
    (a bare `BertModel` under a SEQ_CLS adapter that saves a classifier), while the model
    served is peft's task model, whose head the merged weights carry (sr.models.heads)."""
    if "architectures" not in layout.config:
        return layout
    config = {k: v for k, v in layout.config.items() if k != "architectures"}
    return attrs.evolve(layout, config=config)


def _check_model_type(folder: Path, spec: LoraSpec, model_type: str) -> None:
    """An adapter's own config.json or peft's auto_mapping may name the model type it was
    trained on; it must be the base's."""
    own = folder / "config.json"
    named = str(read_json_object(own).get("model_type") or "") if own.is_file() else ""
    if not named and spec.trained_on:
        match = re.match(r"transformers\.models\.([a-z0-9_]+)\.", spec.trained_on)
        named = match.group(1).replace("_", "-") if match else ""
    if named and named != model_type:
        raise UnsupportedModel(
            f"{folder}: the adapter was trained on a {named} model, but its base"
            f" {spec.base!r} is a {model_type} model"
        )


def _with_labels(folder: Path, layout: CheckpointLayout) -> CheckpointLayout:
    own = folder / "config.json"
    if not own.is_file():
        return layout
    labels = {k: v for k, v in read_json_object(own).items() if k in _LABEL_KEYS}
    if not labels:
        return layout
    config = {k: v for k, v in layout.config.items() if k not in _LABEL_KEYS} | labels
    return attrs.evolve(layout, config=config, head_labels=_head_labels(config))


def _lora_module(key: str) -> tuple[str, str] | None:
    """(module, part) of a LoRA tensor name, or None for a whole tensor."""
    for part in _LORA_PARTS:
        if key.endswith("." + part):
            return key[: -len(part) - 1], part
    return None


def _merge(adapter: Adapter, raw: dict, tensors: dict) -> dict[str, torch.Tensor]:
    spec, where = adapter.spec, adapter.folder / ADAPTER_WEIGHTS
    family = FAMILY_LINEARS[adapter.layout.model_type]
    weights = strip_prefix(raw, family.prefix)
    names = {}
    for key in tensors:
        if not key.startswith(PEFT_PREFIX):
            raise UnsupportedModel(f"{where}: tensor {key!r} is not under {PEFT_PREFIX!r}")
        names[key] = key.removeprefix(PEFT_PREFIX)
    stray = [n for n in names.values() if ".lora_" in n and _lora_module(n) is None]
    if stray:
        raise UnsupportedModel(
            f"{where}: tensor {stray[0]!r} is not served (sr merges lora_A, lora_B into linear"
            " layers)"
        )
    # The trained model's naming: the family's prefix on backbone modules, or none.
    prefixed = any(n.startswith(family.prefix) for n in names.values())

    def trained_name(name: str) -> str:
        head = any(name == h or name.startswith(h + ".") for h in family.heads)
        return family.prefix + name if prefixed and not head else name

    def own_name(name: str) -> str:
        return name.removeprefix(family.prefix) if prefixed else name

    lora: dict[str, dict[str, str]] = {}
    whole: dict[str, tuple[str, str]] = {}  # own name -> (file name, name in the model)
    for key, name in names.items():
        found = _lora_module(name)
        if found is not None:
            lora.setdefault(found[0], {})[found[1]] = key
            continue
        if ".original_module." in name:
            continue  # with bias="all": the base's own copy of a module saved whole
        # A module saved whole, or a biased layer's base, as peft's wrappers name them.
        plain = name.replace(".modules_to_save.", ".").replace(".base_layer.", ".")
        whole[own_name(plain)] = (key, plain)
    linears = {
        trained_name(key.removesuffix(".weight"))
        for key in (*weights, *whole)
        if key.endswith(".weight") and re.fullmatch(family.linear, key.removesuffix(".weight"))
    }
    targeted = _targeted(spec, linears, family, where, adapter.layout.model_type)
    unknown = sorted(set(lora) - targeted)
    if unknown:
        raise UnsupportedModel(_not_targeted(unknown[0], spec, linears, family, where))
    for module in sorted(targeted):
        parts = lora.get(module, {})
        if "lora_A.weight" not in parts or "lora_B.weight" not in parts:
            raise UnsupportedModel(f"{where}: lacks lora_A/lora_B for the targeted {module!r}")
    for key, (name, plain) in sorted(whole.items()):
        _replace(weights, key, tensors[name], spec, plain, targeted, family, where)
        adapter.replaced.append(key)
    for module in sorted(targeted):
        parts = {part: tensors[name] for part, name in lora[module].items()}
        scale = _merge_one(weights, own_name(module), module, parts, spec, where)
        adapter.merged.append(module)
        adapter.scales.add(scale)
    if spec.task_type == "SEQ_CLS" and family.head_out not in weights:
        raise UnsupportedModel(
            f"{where}: a SEQ_CLS adapter, but neither it nor its base holds the classifier"
            f" ({family.head_out}; peft would start it at random)"
        )
    _fit_labels(adapter, weights, family)
    return weights


def _targeted(spec: LoraSpec, linears: set[str], family, where, model_type) -> set[str]:
    if spec.target_modules == ALL_LINEAR:
        # peft's expansion: every linear layer but a classification model's output layer.
        drop = {"classifier", "score"} if spec.task_type == "SEQ_CLS" else set()
        spec = attrs.evolve(spec, target_modules=tuple(sorted(linears - drop)))
    targeted = {name for name in linears if spec.targets(name)}
    if isinstance(spec.target_modules, str):
        if not targeted:
            raise UnsupportedModel(
                f"{where}: target_modules {spec.target_modules!r} matches none of the"
                f" {model_type} base's linear layers ({_examples(linears)})"
            )
        return targeted
    for entry in spec.target_modules:
        if not any(n == entry or n.endswith("." + entry) for n in linears):
            raise UnsupportedModel(
                f"{where}: target_modules names {entry!r}, which the {model_type} base does not"
                f" have as a linear layer ({_examples(linears)})"
            )
    return targeted


def _examples(linears: set[str]) -> str:
    leaves = sorted({name.rsplit(".", 1)[-1] for name in linears})
    return "its linear layers end in " + ", ".join(leaves)


def _not_targeted(module: str, spec: LoraSpec, linears: set[str], family, where) -> str:
    for prefix, model_type in _PREFIX_TYPES.items():
        if module.startswith(prefix) and prefix != family.prefix:
            return (
                f"{where}: the adapter was trained on a {model_type} model (its tensors are"
                f" named {module!r}), which its base is not"
            )
    if module not in linears:
        return f"{where}: holds LoRA weights for {module!r}, which the base does not have"
    return f"{where}: holds LoRA weights for {module!r}, which target_modules does not name"


def _replace(weights, key: str, tensor, spec: LoraSpec, name: str, targeted, family, where):
    module, _, parameter = name.rpartition(".")
    saved = any(spec.saved_whole(m) for m in _ancestors(module))
    trained_bias = parameter == "bias" and (
        spec.bias == "all" or (spec.bias == "lora_only" and module in targeted)
    )
    if not saved and not trained_bias:
        raise UnsupportedModel(
            f"{where}: holds the tensor {name!r}, which is neither LoRA, nor one of"
            f" modules_to_save {list(spec.modules_to_save)}, nor a bias bias={spec.bias!r} saves"
        )
    current = weights.get(key)
    if current is None and not any(key.startswith(h) for h in family.heads):
        raise UnsupportedModel(f"{where}: replaces {name!r}, which the base does not have")
    if current is not None and current.shape != tensor.shape:
        raise UnsupportedModel(
            f"{where}: {name!r} is {tuple(tensor.shape)}, the base's is {tuple(current.shape)}"
        )
    weights[key] = tensor


def _ancestors(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _merge_one(weights, key: str, module: str, parts, spec: LoraSpec, where) -> float:
    """W + scale * B @ A (and the bias + scale * B's bias) for one module; its scale."""
    weight = weights[key + ".weight"]
    a, b = parts["lora_A.weight"], parts["lora_B.weight"]
    r, scale = spec.scale(module)
    out_features, in_features = weight.shape
    if a.shape != (r, in_features) or b.shape != (out_features, r):
        raise UnsupportedModel(
            f"{where}: {module!r} has lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)};"
            f" a rank-{r} LoRA of its {out_features}x{in_features} weight needs"
            f" ({r}, {in_features}) and ({out_features}, {r})"
        )
    # fan_in_fan_out only transposes GPT-2 style Conv1D weights; peft sets it false for
    # torch.nn.Linear, the layer every sr family has.
    delta = (b.float() @ a.float()) * scale
    weights[key + ".weight"] = weight.float() + delta
    if "lora_B.bias" in parts:
        bias = weights.get(key + ".bias")
        if bias is None:
            raise UnsupportedModel(
                f"{where}: lora_bias on {module!r}, whose base layer has no bias to merge into"
            )
        weights[key + ".bias"] = bias.float() + parts["lora_B.bias"].float() * scale
    return scale


def _fit_labels(adapter: Adapter, weights, family) -> None:
    """Labels that fit the served classifier (see the module docstring)."""
    head = weights.get(family.head_out)
    layout = adapter.layout
    if head is None or layout.head_labels is None or len(layout.head_labels) == head.shape[0]:
        return
    if (adapter.folder / "config.json").is_file():
        return  # the adapter's own labels: EncoderModel refuses a count that does not fit
    config = {k: v for k, v in layout.config.items() if k not in ("id2label", "label2id")}
    adapter.layout = attrs.evolve(layout, config=config, head_labels=None)
