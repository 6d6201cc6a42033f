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

from typing import Any

import attrs

from sr.http.jsonbody import compact_json

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
    return compact_json(values) if "n" in text else text


# Each item's text before its index and between its index and its vector, per list kind.
_EMBEDDING_ITEM = ('{"object":"embedding","index":', ',"embedding":')
_TOKEN_EMBEDDINGS_ITEM = ('{"object":"token_embeddings","index":', ',"embeddings":')


@attrs.frozen
class VectorList:
    """An OpenAI-shaped list of vectors: `{"object": "list", "model", "data": [{"object",
    "index", vector field}], "usage"}`: /v1/embeddings' (items `embedding`, each a list of
    floats or a base64 string) and /v1/token_embeddings' (items `token_embeddings`, field
    `embeddings`: each a list of per-token vectors). `float32`: the floats are float32 values
    as the model gave them (not base64, not computed here in float64)."""

    model: str
    vectors: list[Any]
    usage: dict[str, int]
    float32: bool
    item: tuple[str, str] = _EMBEDDING_ITEM

    @classmethod
    def token_embeddings(cls, model: str, rows: list[list[list[float]]], usage: dict[str, int]):
        return cls(model, rows, usage, True, _TOKEN_EMBEDDINGS_ITEM)

    def to_json(self) -> bytes:
        write = float32_json if self.float32 else compact_json
        if self.item is _TOKEN_EMBEDDINGS_ITEM:
            texts = ["[" + ",".join(map(write, row)) + "]" for row in self.vectors]
        else:
            texts = [write(vector) for vector in self.vectors]
        head, field = self.item
        data = ",".join([f"{head}{i}{field}{text}}}" for i, text in enumerate(texts)])
        model, usage = compact_json(self.model), compact_json(self.usage)
        text = f'{{"object":"list","model":{model},"data":[{data}],"usage":{usage}}}'
        return text.encode()
