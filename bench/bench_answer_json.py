"""The JSON of vector answers: the worker's writing and the router's TEI reshaping, against
the json module doing the same, sides alternating.

    python -m bench.bench_answer_json [--rounds 7]

Cases, float32 values as a model gives them (a seeded random tensor's `tolist()`):
* one MiniLM vector (384 floats), 32 of them, and 512 tokens' per-token states (2 x 256
  x 384 floats, /v1/token_embeddings);
* worker: the json module's encoder on the answer's dict (repr of every float) against
  sr.worker.embedding_answer.VectorList (9 significant digits, one C call a vector);
* router, TEI's /embed and /embed_all from the worker's answer: `json.loads` and
  `json.dumps` of TEI's shape (every number read as a float, written with repr) against
  sr.router.tei.tei_answer (the numbers kept as the worker's text).
Medians of per-round times (microseconds) and the bytes written. Writes
bench/results/answer_json.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from bench.harness import print_table, write_result
from sr.router import tei
from sr.worker.embedding_answer import VectorList

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, check_circular=False).encode
_USAGE = {"prompt_tokens": 512, "total_tokens": 512}


def _json_list(item: str, field: str, vectors: list) -> bytes:
    data = [{"object": item, "index": i, field: vector} for i, vector in enumerate(vectors)]
    return _dumps({"object": "list", "model": "m", "data": data, "usage": _USAGE}).encode()


def _json_tei(payload: bytes, field: str) -> bytes:
    rows = sorted(json.loads(payload)["data"], key=lambda row: row["index"])
    return _dumps([row[field] for row in rows]).encode()


def _cases() -> list[tuple[str, dict[str, Callable[[], bytes]]]]:
    generator = torch.Generator().manual_seed(0)

    def floats(*shape: int) -> list:
        return (torch.randn(*shape, generator=generator) / 4).tolist()

    cases = []
    for name, vectors in (("one vector (384)", floats(1, 384)), ("32 vectors", floats(32, 384))):
        answer = VectorList("m", vectors, _USAGE, True)
        payload = answer.to_json()
        embed = tei.parse_request(tei.EMBED, b'{"inputs":"a"}', None, None)
        cases.append((f"worker, {name}", {
            "json": lambda v=vectors: _json_list("embedding", "embedding", v),
            "sr": answer.to_json,
        }))  # fmt: skip
        cases.append((f"router TEI /embed, {name}", {
            "json": lambda p=payload: _json_tei(p, "embedding"),
            "sr": lambda p=payload, r=embed: tei.tei_answer(r, p),
        }))  # fmt: skip
    rows = [floats(256, 384), floats(256, 384)]
    answer = VectorList.token_embeddings("m", rows, _USAGE)
    payload = answer.to_json()
    embed_all = tei.parse_request(tei.EMBED_ALL, b'{"inputs":["a","b"]}', None, None)
    cases.append(("worker, 512 tokens' states", {
        "json": lambda: _json_list("token_embeddings", "embeddings", rows),
        "sr": answer.to_json,
    }))  # fmt: skip
    cases.append(("router TEI /embed_all, 512 tokens", {
        "json": lambda: _json_tei(payload, "embeddings"),
        "sr": lambda: tei.tei_answer(embed_all, payload),
    }))  # fmt: skip
    return cases


def _time(fn: Callable[[], bytes], budget_s: float = 0.2) -> float:
    """Microseconds a call, over as many calls as fit in about `budget_s`."""
    started, calls = time.perf_counter(), 0
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - started
        if elapsed >= budget_s:
            return elapsed / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    results = []
    for name, sides in _cases():
        times: dict[str, list[float]] = {side: [] for side in sides}
        for number in range(args.rounds):
            order = list(sides) if number % 2 == 0 else list(reversed(sides))
            for side in order:
                times[side].append(_time(sides[side]))
        medians = {side: statistics.median(values) for side, values in times.items()}
        sizes = {side: len(fn()) for side, fn in sides.items()}
        results.append({"case": name, "us": medians, "bytes": sizes,
                        "ratio": medians["sr"] / medians["json"]})  # fmt: skip
    print_table(
        ["case", "json us", "sr us", "sr / json", "json bytes", "sr bytes"],
        [[r["case"], f"{r['us']['json']:.1f}", f"{r['us']['sr']:.1f}", f"{r['ratio']:.2f}",
          r["bytes"]["json"], r["bytes"]["sr"]] for r in results],
    )  # fmt: skip
    write_result("answer_json", {"rounds": args.rounds, "cases": results})


if __name__ == "__main__":
    main()
