"""A folder's prompts, as sentence-transformers reads them from
config_sentence_transformers.json (`prompts`, `default_prompt_name`).

sentence-transformers' `encode(texts, prompt_name=name)` prepends the prompt's text to each
text (`prompt + text`) and tokenizes the result; without a `prompt_name` it applies the
folder's `default_prompt_name`, if any. Every model also knows `query` and `document`, empty
unless the folder gives them a text (sentence-transformers' own defaults), so a client that
always names one of them is served by any folder. With `include_prompt: false` in the
Pooling config, the prompt's tokens (its leading special token included, its closing one
not) are left out of the pooling.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs

from sr.errors import UnsupportedModel
from sr.models.json_file import read_json_object

CONFIG_FILE = "config_sentence_transformers.json"
# sentence-transformers' defaults for every SentenceTransformer and SparseEncoder: known
# names whose text is empty until the folder gives one.
_DEFAULT_NAMES = ("query", "document")


@attrs.frozen
class Prompts:
    texts: Mapping[str, str] = attrs.field(factory=lambda: dict.fromkeys(_DEFAULT_NAMES, ""))
    default_name: str | None = None

    def text_of(self, name: str | None) -> str:
        """The text prepended for `name` (None: the default prompt's, or none); KeyError
        for a name the folder does not know."""
        if name is None:
            name = self.default_name
            if name is None:
                return ""
        return self.texts[name]

    def card(self) -> dict:
        """The worker card's `prompts` entry."""
        return {"texts": dict(self.texts), "default_prompt_name": self.default_name}


def read_prompts(folder: Path) -> Prompts:
    """The prompts of `folder` (sentence-transformers' defaults when it has no config)."""
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        return Prompts()
    config = read_json_object(path)
    saved = config.get("prompts") or {}
    if not isinstance(saved, dict) or not all(
        isinstance(name, str) and isinstance(text, str) for name, text in saved.items()
    ):
        raise UnsupportedModel(f"{path}: prompts must map names to strings")
    texts = dict.fromkeys(_DEFAULT_NAMES, "") | saved
    default = config.get("default_prompt_name")
    if default is not None and default not in texts:
        # sentence-transformers refuses to load such a folder too.
        raise UnsupportedModel(
            f"{path}: default_prompt_name {default!r} is not one of the prompts "
            f"({', '.join(texts)})"
        )
    return Prompts(texts, default)
