"""The JSON text of a list of vectors (embeddings, per-token states): float32 ones at C speed.

Python's json writes a float with `repr`, the shortest text that reads back as the same
float64: a float32 value widened to float64 takes up to 17 digits (0.10000000149011612),
and repr's search for them costs about 1 us a value, the largest part of a one-text
answer's cost in the worker. Nine significant digits read back as the same float32, every
one (the round-trip bound of IEEE 754's binary32), and '%.9g' writes a whole vector in one
C call: MiniLM's 384 values in 130 us against 433 us, 5.2 KB against 8.0 KB, and each
client's parse shortens with them. A vector computed here in float64 (made unit length
again after `dimensions` cut it, or normalised on request) is written by repr as before:
nine digits would round what float64 holds. Per-token answers (a hidden state per token,
hundreds of thousands of floats for a long text) are written the same way.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, check_circular=False).encode
# One format string per vector length: a model's embedding size and the `dimensions` asked
# for below it, so a few entries at most.
_vector_formats: dict[int, str] = {}


def float32_json(values: list[float]) -> str:
    """A JSON array of float32 values (as floats), each read back as the same float32."""
    fmt = _vector_formats.get(len(values))
    if fmt is None:
        fmt = _vector_formats[len(values)] = "[" + ",".join(["%.9g"] * len(values)) + "]"
    text = fmt % tuple(values)
    # '%.9g' writes nan and inf, which JSON has no words for; only they hold an 'n'
    # ('e' is the exponent's letter). The json module writes them as before (NaN, Infinity).
    return _dumps(values) if "n" in text else text


@attrs.frozen
class VectorList:
    """An OpenAI-shaped list of vectors: `{"object": "list", "model", "data": [{"object":
    ITEM, "index", FIELD: vector}], "usage"}`: /v1/embeddings' (`embedding`, each a list of
    floats or a base64 string) and /v1/token_embeddings' (`token_embeddings`, `embeddings`:
    each a list of per-token vectors, `per_token`). `float32`: the floats are float32 values
    as the model gave them (not base64, not computed here in float64)."""

    model: str
    item: str
    field: str
    vectors: list[Any]
    usage: dict[str, int]
    float32: bool
    per_token: bool = False

    @classmethod
    def embeddings(cls, model: str, vectors: list[Any], usage: dict[str, int], float32: bool):
        return cls(model, "embedding", "embedding", vectors, usage, float32)

    @classmethod
    def token_embeddings(cls, model: str, rows: list[list[list[float]]], usage: dict[str, int]):
        return cls(model, "token_embeddings", "embeddings", rows, usage, True, per_token=True)

    def to_json(self) -> bytes:
        write = float32_json if self.float32 else _dumps
        if self.per_token:
            texts = ["[" + ",".join(map(write, row)) + "]" for row in self.vectors]
        else:
            texts = [write(vector) for vector in self.vectors]
        head, field = f'{{"object":"{self.item}","index":', f',"{self.field}":'
        data = ",".join([f"{head}{i}{field}{text}}}" for i, text in enumerate(texts)])
        model = _dumps(self.model)
        text = f'{{"object":"list","model":{model},"data":[{data}],"usage":{_dumps(self.usage)}}}'
        return text.encode()
