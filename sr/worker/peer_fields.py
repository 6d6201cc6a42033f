"""Fields other embedding APIs define on /v1/embeddings, read as sr's own.

The rule (docs/decisions.md, "Fields the peer APIs define"): a field a peer API (Jina,
Infinity, Cohere, TEI, vLLM) defines for a route is accepted and either honoured, by its
native equivalent, or ignored where ignoring it changes nothing the caller can see; a value
sr cannot honour is refused naming the field; a field no peer defines stays refused, so a
misspelling never silently serves a default. Pure.

    embedding_type  (Jina)      "float" / "base64": encoding_format; others refused
    normalized      (Jina)      normalize
    late_chunking   (Jina)      false accepted; true refused (sr embeds each input alone)
    modality        (Infinity)  "text" accepted; others refused (sr serves text models)
"""

from __future__ import annotations

from typing import Any

from sr.errors import InvalidRequest
from sr.http.jsonbody import json_kind

EMBEDDING_PEER_FIELDS = frozenset({"embedding_type", "normalized", "late_chunking", "modality"})


def embeddings_body(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with the peers' fields as the native ones (the same dict when it has none)."""
    if body.keys().isdisjoint(EMBEDDING_PEER_FIELDS):
        return body
    native = {k: v for k, v in body.items() if k not in EMBEDDING_PEER_FIELDS}
    if "embedding_type" in body:
        kind = body["embedding_type"]
        if kind not in ("float", "base64"):
            raise InvalidRequest(
                f"embedding_type: expected 'float' or 'base64', got {_shown(kind)} (sr answers "
                "float32 vectors only)"
            )
        _same(native, "encoding_format", kind, "embedding_type")
    if "normalized" in body:
        normalized = body["normalized"]
        if not isinstance(normalized, bool):
            raise InvalidRequest(f"normalized: expected true or false, got {json_kind(normalized)}")
        _same(native, "normalize", normalized, "normalized")
    late = body.get("late_chunking")
    if late not in (None, False):
        raise InvalidRequest(
            "late_chunking: only false is supported; sr embeds each input on its own"
        )
    modality = body.get("modality")
    if modality not in (None, "text"):
        raise InvalidRequest(f"modality: expected 'text', got {_shown(modality)}")
    return native


def _same(native: dict[str, Any], field: str, value: Any, peer: str) -> None:
    if field in native and native[field] != value:
        raise InvalidRequest(f"{peer}: {value!r} contradicts {field}: {native[field]!r}")
    native[field] = value


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else json_kind(value)
