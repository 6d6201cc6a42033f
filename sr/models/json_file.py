"""Reading a model folder's JSON files, with the one error every loader gives.

A folder's config files (config.json, modules.json, the Pooling and Dense configs,
adapter_config.json, config_sentence_transformers.json) are read here, so a file that is
missing, unreadable or not JSON is refused at load as `UnsupportedModel` naming the file,
the same way for every family and head.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sr.errors import UnsupportedModel


def read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UnsupportedModel(f"{path}: cannot be read as JSON: {exc}") from exc


def read_json_object(path: Path) -> dict[str, Any]:
    """`path`'s JSON, which must be an object."""
    value = read_json(path)
    if not isinstance(value, dict):
        raise UnsupportedModel(f"{path}: not an object")
    return value
