"""The embeddings answer's JSON text: float32 vectors read back as the same float32 values.

The reference for "the same float32" is the struct module's IEEE binary32 packing, not the
writer's own arithmetic.
"""

from __future__ import annotations

import json
import math
import random
import struct

import pytest

from sr.worker.embedding_answer import VectorList, float32_json
from tests.float32 import as_float32


def _float32_values(count: int, seed: int) -> list[float]:
    """Float32 values over the whole range: every exponent, subnormals, signs, zeros."""
    rng = random.Random(seed)
    bits = [rng.getrandbits(32) for _ in range(count)]
    bits += [0x00000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0x80000000, 0x3F800000, 0x3DCCCCCD]
    values = list(struct.unpack(f"<{len(bits)}f", struct.pack(f"<{len(bits)}I", *bits)))
    return [v for v in values if math.isfinite(v)]


def _strict_loads(text: str):
    def refuse(word: str):
        raise AssertionError(f"{word} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("seed", range(4))
def test_every_float32_reads_back_as_itself(seed):
    values = _float32_values(5000, seed)
    read = _strict_loads(float32_json(values))
    assert as_float32(read) == values
    # Nine significant digits at most: never longer than repr's float64 text.
    assert len(float32_json(values)) <= len(json.dumps(values, separators=(",", ":")))


def test_a_vector_with_nan_or_infinity_is_written_as_the_json_module_writes_it():
    values = [0.5, math.nan, -math.inf, math.inf]
    assert float32_json(values) == json.dumps(values, separators=(",", ":"))


def test_the_answer_has_openais_shape_and_order():
    vectors = [as_float32([0.1, -2.5e-7, 3.0]), as_float32([1e-40, 0.0, -0.0])]
    usage = {"prompt_tokens": 4, "total_tokens": 4}
    answer = VectorList("acme/model", vectors, usage, True)
    text = answer.to_json().decode()
    parsed = _strict_loads(text)
    assert list(parsed) == ["object", "model", "data", "usage"]
    assert parsed["object"] == "list" and parsed["model"] == "acme/model"
    assert parsed["usage"] == {"prompt_tokens": 4, "total_tokens": 4}
    assert [list(item) for item in parsed["data"]] == [["object", "index", "embedding"]] * 2
    assert [item["index"] for item in parsed["data"]] == [0, 1]
    assert [as_float32(item["embedding"]) for item in parsed["data"]] == vectors
    assert '"embedding":[0.100000001,' in text  # not repr's 0.10000000149011612


def test_float64_vectors_and_base64_strings_are_written_exactly():
    unit = [0.6000000000000001, 0.7999999999999999]
    usage = {"prompt_tokens": 1, "total_tokens": 1}
    answer = VectorList('a "quoted" name', [unit], usage, False)
    parsed = _strict_loads(answer.to_json().decode())
    assert parsed["data"][0]["embedding"] == unit
    assert parsed["model"] == 'a "quoted" name'
    encoded = VectorList("m", ["AACAPw=="], usage, False)
    assert _strict_loads(encoded.to_json().decode())["data"][0]["embedding"] == "AACAPw=="


def test_per_token_vectors_are_written_as_float32_too():
    rows = [[as_float32([0.1, -0.2]), as_float32([3e-8, 1.5])], [as_float32([7.0, -0.0])]]
    usage = {"prompt_tokens": 3, "total_tokens": 3}
    text = VectorList.token_embeddings("m", rows, usage).to_json().decode()
    parsed = _strict_loads(text)
    assert list(parsed) == ["object", "model", "data", "usage"]
    assert [list(item) for item in parsed["data"]] == [["object", "index", "embeddings"]] * 2
    assert {item["object"] for item in parsed["data"]} == {"token_embeddings"}
    assert [item["index"] for item in parsed["data"]] == [0, 1]
    assert [[as_float32(v) for v in item["embeddings"]] for item in parsed["data"]] == rows
    assert '"embeddings":[[0.100000001,' in text
