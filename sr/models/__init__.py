"""sr.models: artifact resolution, the model families in plain torch, pooling, heads.

from sr.models import load_model, resolve_artifact
model = load_model(resolve_artifact("sentence-transformers/all-MiniLM-L6-v2"))
vectors = model.embed(model.tokenize(["hello"]))
result = golden_check(model)          # worker startup

The names are imported on first use (PEP 562): the router process imports
`sr.models.artifacts` and `sr.models.download` without torch, which `encoder` and
`golden` bring in (about 190 MB and 2 s at startup).
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "EMBEDDED_DEFAULT": "sr.models.artifacts",
    "resolve_artifact": "sr.models.artifacts",
    "EncoderModel": "sr.models.encoder",
    "load_model": "sr.models.encoder",
    "GOLDEN_INPUTS": "sr.models.golden",
    "GoldenResult": "sr.models.golden",
    "golden_check": "sr.models.golden",
    "UnsupportedModel": "sr.errors",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'sr.models' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
