"""How many tokens one input may have on a model folder, read from its files alone (no torch).

* `ceiling`: what the model can take: config.json's `max_position_embeddings`, less the
  positions a family reserves (RoBERTa, XLM-R and MPNet count positions from
  `pad_token_id + 1`, so a 514-row table takes 512 tokens); the family's own default where
  config.json says nothing (ModernBERT 8192, DeBERTa 512, Gemma3 131072).
* `default`: what sentence-transformers cuts at, the folder's `sentence_bert_config.json`
  `max_seq_length`, when present (all-mpnet-base-v2: 384 of its 512), else the ceiling.

A deployment without `input.max_tokens` serves `default`: `settle_input_limits` writes it
into the config wherever the folder resolves (`sr serve`, which then writes the canonical
file, and every reload, so a file with and without the number start the same replicas),
and a worker started without `--max-tokens` takes it at load. A `max_tokens` above
`ceiling` is refused in one line naming both numbers: rows past the position table cannot
be computed. An adapter folder takes its base's limits.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from sr.config.schema import SrConfig
from sr.errors import SrError, UnsupportedModel, UsageError
from sr.models.checkpoint import read_layout
from sr.models.lora_config import is_adapter_folder, read_lora_config
from sr.settings import ModelSources

# Families whose position ids start at pad_token_id + 1 (transformers'
# `create_position_ids_from_input_ids`).
_PADDING_OFFSET = frozenset({"roberta", "xlm-roberta", "mpnet"})
# max_position_embeddings where config.json leaves it out (transformers' config defaults).
_DEFAULT_POSITIONS = {"modernbert": 8192, "deberta-v2": 512, "gemma3_text": 131_072}


@attrs.frozen
class TokenLimits:
    default: int  # what a deployment without input.max_tokens serves
    ceiling: int  # the most the model can take


def token_limits(folder: Path, sources: ModelSources | None = None) -> TokenLimits:
    """The limits of the model folder (or adapter folder) `folder`; UnsupportedModel when
    its config.json names no limit."""
    if is_adapter_folder(folder):
        from sr.models.artifacts import resolve_artifact

        spec = read_lora_config(folder)
        folder = resolve_artifact(spec.base, spec.base_revision, sources=sources)
    layout = read_layout(folder)
    config = layout.config
    positions = config.get("max_position_embeddings", _DEFAULT_POSITIONS.get(layout.model_type))
    if not isinstance(positions, int) or positions < 1:
        raise UnsupportedModel(f"{folder}/config.json: max_position_embeddings is not a count")
    ceiling = positions
    if layout.model_type in _PADDING_OFFSET:
        ceiling -= int(config.get("pad_token_id", 1)) + 1
    return TokenLimits(default_max_tokens(layout.max_seq_length, ceiling), ceiling)


def default_max_tokens(max_seq_length: int | None, ceiling: int) -> int:
    """sentence-transformers' own cut when the folder has one within the ceiling, else it."""
    if max_seq_length is not None and 0 < max_seq_length <= ceiling:
        return max_seq_length
    return ceiling


def over_ceiling(where: str, max_tokens: int, ceiling: int) -> str:
    """The one line that refuses `max_tokens` above what the model takes."""
    return (
        f"{where} {max_tokens} is above what the model takes ({ceiling} tokens, from its "
        "max_position_embeddings)"
    )


def settle_input_limits(cfg: SrConfig, sources: ModelSources | None = None) -> None:
    """Each managed deployment's `input.max_tokens` against its folder, in place: unset, it
    becomes the folder's own; above what the model takes, a UsageError naming both numbers.
    A folder that does not resolve offline is left alone: its workers read it at load."""
    from sr.models.artifacts import resolve_artifact

    for name, deployment in cfg.deployments.items():
        if deployment.attached:
            continue
        try:
            folder = resolve_artifact(deployment.artifact, deployment.revision, sources=sources)
            limits = token_limits(folder, sources)
        except SrError:  # not here yet, or not a model: the worker says why at load
            continue
        if deployment.input.max_tokens is None:
            deployment.input.max_tokens = limits.default
        elif deployment.input.max_tokens > limits.ceiling:
            path = f"global.model_catalog.deployments.{name}.input.max_tokens"
            raise UsageError(over_ceiling(path, deployment.input.max_tokens, limits.ceiling))
