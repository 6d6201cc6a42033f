"""Model families, keyed by config.json `model_type`.

A family turns (config, safetensors weights, device) into an object with
`hidden_states(ids [T], packed) -> [T, H]` over packed rows (sr.models.blocks.Packed),
`hidden_size`, `max_positions`, `vocab_size`, `calibrate()` (BLAS cut-off rows, see
gemm_rows), `has_head` and, with a head, `num_labels` and `classify(hidden, packed)`.
Families share their building blocks (sr.models.blocks); adding one is a module on those
blocks and one entry here.
"""

from __future__ import annotations

from collections.abc import Callable

from sr.errors import UnsupportedModel
from sr.models.bert import BertEncoder, RobertaEncoder

FAMILIES: dict[str, Callable] = {
    "bert": BertEncoder,
    "roberta": RobertaEncoder,
    "xlm-roberta": RobertaEncoder,
}


def family_for(model_type: str) -> Callable:
    try:
        return FAMILIES[model_type]
    except KeyError:
        known = ", ".join(sorted(FAMILIES))
        raise UnsupportedModel(
            f"model_type {model_type!r} is not supported (supported: {known})"
        ) from None
