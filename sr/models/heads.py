"""Which head a checkpoint folder is served with: the one config.json's `architectures` names.

Every family lists the Hugging Face classes it serves in its `architectures` class
attribute (class name -> "sequence", "token", or None for the bare model), and its
`_load_head` asks `named_head` which one to load:

* `*ForSequenceClassification` -> the sequence head (`classify`: one answer per text);
* `*ForTokenClassification` -> the token head (`head_task = "token"`, `token_logits`: one
  answer per token);
* the bare `*Model` -> no head (embeddings only), whatever head tensors the file holds;
* no `architectures` at all -> the family's own rule from before (the sequence head when
  its tensors are there).

Any other class (`BertForMaskedLM`, `BertForQuestionAnswering`, ...) is refused at load in
one line naming it and the supported ones (`check_architectures`), never served with
another head's answer, except in a sentence-transformers folder (modules.json): there
sentence-transformers itself loads the bare model whatever config.json names (the MPNet
and Qwen3 embedders ship `MPNetForMaskedLM` and `Qwen3ForCausalLM`), and so does sr.
"""

from __future__ import annotations

from collections.abc import Mapping

from sr.errors import UnsupportedModel
from sr.models.checkpoint import CheckpointLayout

SEQUENCE = "sequence"
TOKEN = "token"
_HEAD_NAMES = {SEQUENCE: "sequence-classification", TOKEN: "token-classification"}


def architectures_of(*names: str, token: bool = True) -> dict[str, str | None]:
    """The Hugging Face classes a family serves, as transformers names them from each
    model name: `{name}Model` (no head), `{name}ForSequenceClassification` and, with
    `token`, `{name}ForTokenClassification`."""
    served: dict[str, str | None] = {}
    for name in names:
        served[f"{name}Model"] = None
        served[f"{name}ForSequenceClassification"] = SEQUENCE
        if token:
            served[f"{name}ForTokenClassification"] = TOKEN
    return served


def named_head(
    config: dict, architectures: Mapping[str, str | None], unnamed: str | None
) -> str | None:
    """The head config.json's `architectures` names among a family's `architectures`:
    "sequence", "token", or None (the bare model, or a class the family does not serve,
    which `check_architectures` has already refused unless the folder is a
    sentence-transformers one); `unnamed` when config.json names no architecture."""
    names = config.get("architectures") or []
    if not names:
        return unnamed
    heads = {architectures.get(name) for name in names}
    # Several heads named at once: refused by check_architectures; none served here.
    return heads.pop() if len(heads) == 1 else None


def check_architectures(layout: CheckpointLayout, family) -> None:
    """Refuse, in one line, a folder whose `architectures` names a class `family` does not
    serve (a sentence-transformers folder excepted: its bare model is served) or several
    heads at once. A family that lists no `architectures` checks its own."""
    served: Mapping[str, str | None] = getattr(family, "architectures", None) or {}
    names = [str(name) for name in layout.config.get("architectures") or []]
    if not served or not names:
        return
    unknown = [name for name in names if name not in served]
    if unknown and not layout.sentence_transformers:
        raise UnsupportedModel(
            f"architecture {unknown[0]!r} is not supported for model_type "
            f"{layout.model_type!r} "
            f"(supported: {', '.join(served)})"
        )
    heads = {served[name] for name in names if name in served}
    if len(heads) > 1:
        raise UnsupportedModel(f"config.json architectures {names!r} name several heads")


def check_served_head(config: dict, backbone) -> None:
    """The head the backbone loaded is the one config.json names: a family that listed a
    class but loaded another head (or none) must fail at load, not answer as another."""
    served: Mapping[str, str | None] = getattr(type(backbone), "architectures", None) or {}
    if not served or not config.get("architectures"):
        return
    named = named_head(config, served, None)
    loaded = backbone.head_task if backbone.has_head else None
    if named != loaded:
        want = f"a {_HEAD_NAMES[named]} head" if named else "no head"
        got = f"a {_HEAD_NAMES.get(loaded, str(loaded))} head" if loaded else "none"
        raise UnsupportedModel(
            f"config.json architectures {config['architectures']!r} name {want}, but "
            f"{type(backbone).__name__} loaded {got}"
        )
