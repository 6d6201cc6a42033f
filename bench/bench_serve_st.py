"""End to end through `sr serve` against sentence-transformers in process, embedded MiniLM.

    python -m bench.bench_serve_st [--rounds 20] [--singles 100] [--threads 1]

`sr serve` runs one worker with `--threads N`; sentence-transformers runs in this process
with torch.set_num_threads(N) (equal torch threads; the router and the load generator are
single-threaded Python on top). Interleaved, round by round:
  * batching: 32 concurrent short requests (one input each) through the router vs
    `encode(32 texts, batch_size=32)`; target sr >= 0.8x sentence-transformers' throughput;
  * single: one short request end to end vs `encode(text)`; target sr <= 1.0x its latency.
Writes bench/results/serve_st.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import trio

from bench.harness import ServeProcess, embedded_artifact, http_client, print_table, write_result

BATCH = 32
BATCH_TARGET = 0.8
SINGLE_TARGET = 1.0
SHORT = [
    "What is the capital of France?",
    "hello world",
    "route this to billing",
    "is the model healthy",
    "cancel my order #1234",
    "best GPU for inference",
    "thanks, that solved it",
    "reset my password please",
]


def texts(round_no: int, count: int) -> list[str]:
    # A per-round suffix keeps every cache out of the measurement.
    return [f"{SHORT[i % len(SHORT)]} ({round_no}.{i})" for i in range(count)]


async def sr_batch(client, batch: list[str]) -> float:
    async def one(text: str) -> None:
        body = json.dumps({"model": "primary", "input": text}).encode()
        status, _, payload = await client.request("POST", "/v1/embeddings", body)
        if status != 200:
            raise SystemExit(f"sr serve answered {status}: {payload[:200]!r}")

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for text in batch:
            nursery.start_soon(one, text)
    return time.perf_counter() - started


async def sr_single(client, text: str) -> float:
    body = json.dumps({"model": "primary", "input": text}).encode()
    started = time.perf_counter()
    status, _, _ = await client.request("POST", "/v1/embeddings", body)
    if status != 200:
        raise SystemExit(f"sr serve answered {status}")
    return time.perf_counter() - started


def st_time(model, batch: list[str], batch_size: int) -> float:
    started = time.perf_counter()
    model.encode(batch if len(batch) > 1 else batch[0], batch_size=batch_size)
    return time.perf_counter() - started


async def interleave(url: str, model, rounds: int, singles: int) -> dict:
    client = http_client(url)
    for r in range(3):  # warm-up both sides, every batch shape
        await sr_batch(client, texts(-1 - r, BATCH))
        st_time(model, texts(-1 - r, BATCH), BATCH)
    batch = {"sr": [], "st": []}
    for r in range(rounds):
        sides = ("sr", "st") if r % 2 == 0 else ("st", "sr")
        for side in sides:
            if side == "sr":
                batch[side].append(await sr_batch(client, texts(r, BATCH)))
            else:
                batch[side].append(st_time(model, texts(r, BATCH), BATCH))
    single = {"sr": [], "st": []}
    for i in range(singles):
        text = texts(10_000 + i, 1)
        sides = ("sr", "st") if i % 2 == 0 else ("st", "sr")
        for side in sides:
            if side == "sr":
                single[side].append(await sr_single(client, text[0]))
            else:
                single[side].append(st_time(model, text, 1))
    await client.aclose()
    return {"batch": batch, "single": single}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--singles", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    import sentence_transformers
    import torch

    from sr.models import resolve_artifact

    torch.set_num_threads(args.threads)
    artifact = embedded_artifact()
    model = sentence_transformers.SentenceTransformer(str(resolve_artifact(artifact)), device="cpu")
    with (
        tempfile.TemporaryDirectory(prefix="sr-bench-") as tmp,
        ServeProcess(artifact, Path(tmp), threads=args.threads) as serve,
    ):
        times = trio.run(interleave, serve.url, model, args.rounds, args.singles)

    def ms(values: list[float]) -> dict:
        ordered = sorted(values)
        return {
            "median_ms": round(statistics.median(ordered) * 1000, 3),
            "p90_ms": round(ordered[int(0.9 * len(ordered))] * 1000, 3),
        }

    batch = {side: ms(v) for side, v in times["batch"].items()}
    for side in batch:
        batch[side]["requests_per_s"] = round(BATCH / (batch[side]["median_ms"] / 1000), 1)
    single = {side: ms(v) for side, v in times["single"].items()}
    batch_ratio = batch["sr"]["requests_per_s"] / batch["st"]["requests_per_s"]
    single_ratio = single["sr"]["median_ms"] / single["st"]["median_ms"]
    print_table(
        ("measure", "sr serve", "sentence-transformers", "ratio", "target", "verdict"),
        [
            ("32 concurrent, req/s", batch["sr"]["requests_per_s"],
             batch["st"]["requests_per_s"], f"{batch_ratio:.2f}x", f">= {BATCH_TARGET}x",
             "met" if batch_ratio >= BATCH_TARGET else "not met"),
            ("single request, median ms", single["sr"]["median_ms"], single["st"]["median_ms"],
             f"{single_ratio:.2f}x", f"<= {SINGLE_TARGET}x",
             "met" if single_ratio <= SINGLE_TARGET else "not met"),
        ],
    )  # fmt: skip
    result = {
        "benchmark": "sr serve vs sentence-transformers",
        "artifact": artifact,
        "threads": args.threads,
        "rounds": args.rounds,
        "singles": args.singles,
        "batch32": {**batch, "ratio": round(batch_ratio, 3), "target": BATCH_TARGET},
        "single": {**single, "ratio": round(single_ratio, 3), "target": SINGLE_TARGET},
    }
    write_result("serve_st", result)
    return result


if __name__ == "__main__":
    main()
