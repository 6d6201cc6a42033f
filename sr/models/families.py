"""Model families, keyed by config.json `model_type`.

A family turns (config, safetensors weights, device, dtype, kernel choice) into an object
with `hidden_states(ids [T], packed) -> [T, H]` over packed rows (sr.models.blocks.Packed),
`hidden_size`, `max_positions`, `vocab_size`, `kernel` (sr.models.linear.KernelChoice: every
product goes through `Linear`), `calibrate()` (the cut-off rows of its products, see
gemm_rows), `has_head` and, with a head, `num_labels` and `classify(hidden, packed, ids)` (the
packed ids too: a decoder's head reads each row's last token that is not padding).
Families share their building blocks (sr.models.blocks); adding one is a module on those
blocks and one entry here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from sr.errors import UnsupportedModel

# model_type -> (module, class): a family's module is imported only when a checkpoint of
# it is loaded.
FAMILIES: dict[str, tuple[str, str]] = {
    "bert": ("sr.models.bert", "BertEncoder"),
    "roberta": ("sr.models.bert", "RobertaEncoder"),
    "xlm-roberta": ("sr.models.bert", "RobertaEncoder"),
    "distilbert": ("sr.models.distilbert", "DistilBertEncoder"),
    "mpnet": ("sr.models.mpnet", "MPNetEncoder"),
    "deberta-v2": ("sr.models.deberta", "DebertaV2Encoder"),
    "modernbert": ("sr.models.modernbert", "ModernBertEncoder"),
    "qwen3": ("sr.models.qwen3", "Qwen3Encoder"),
    "gemma3_text": ("sr.models.gemma3", "Gemma3Encoder"),
}


def family_for(model_type: str) -> Callable:
    try:
        module, name = FAMILIES[model_type]
    except KeyError:
        known = ", ".join(sorted(FAMILIES))
        raise UnsupportedModel(
            f"model_type {model_type!r} is not supported (supported: {known})"
        ) from None
    return getattr(importlib.import_module(module), name)
