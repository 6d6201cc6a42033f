"""Worker HTTP API vs sentence-transformers in-process, on the embedded MiniLM.

32 concurrent short requests (one input each) through `sr worker` over a Unix socket,
against `SentenceTransformer.encode(texts, batch_size=32)` in this process, both at the
same torch thread count. Also measures the worker's start-to-ready time and RSS, and the
largest difference between the two answers. Prints a table; writes
bench/results/worker_http.json.

    python -m bench.bench_worker_http [--threads 1] [--rounds 20]   (from the repo root)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

ARTIFACT = "sentence-transformers/all-MiniLM-L6-v2"
CONCURRENCY = 32
TEXTS = [f"short request number {i} about topic {i % 7}" for i in range(CONCURRENCY)]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_worker(sock: str, threads: int) -> tuple[subprocess.Popen, float]:
    started = time.perf_counter()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sr",
            "worker",
            "--artifact",
            ARTIFACT,
            "--threads",
            str(threads),
            "--uds",
            sock,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    with httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://w") as client:
        while time.perf_counter() - started < 120:
            if proc.poll() is not None:
                raise SystemExit("worker exited during startup")
            try:
                if client.get("/health").status_code == 200:
                    return proc, time.perf_counter() - started
            except httpx.TransportError:
                pass
            time.sleep(0.05)
    raise SystemExit("worker not ready after 120 s")


async def http_rounds(sock: str, rounds: int) -> tuple[list[float], list[list[float]]]:
    transport = httpx.AsyncHTTPTransport(uds=sock)
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(transport=transport, base_url="http://w", limits=limits) as client:
        answers: list[list[float]] = [[] for _ in TEXTS]

        async def one(i: int, salt: str) -> None:
            # A per-round salt keeps the worker's result cache out of the measurement.
            reply = await client.post("/v1/embeddings", json={"input": TEXTS[i] + salt})
            reply.raise_for_status()
            if not salt:
                answers[i] = reply.json()["data"][0]["embedding"]

        times = []
        for r in range(rounds + 1):
            salt = "" if r == 0 else f" #{r}"
            start = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for i in range(CONCURRENCY):
                    nursery.start_soon(one, i, salt)
            if r:  # round 0 warms up (and records the unsalted answers)
                times.append(time.perf_counter() - start)
        return times, answers


def st_rounds(threads: int, rounds: int):
    import torch
    from sentence_transformers import SentenceTransformer

    from sr.models import resolve_artifact

    torch.set_num_threads(threads)
    model = SentenceTransformer(str(resolve_artifact(ARTIFACT)), device="cpu")
    answers = model.encode(TEXTS, batch_size=CONCURRENCY, convert_to_numpy=True)
    times = []
    for r in range(1, rounds + 1):
        texts = [t + f" #{r}" for t in TEXTS]
        start = time.perf_counter()
        model.encode(texts, batch_size=CONCURRENCY)
        times.append(time.perf_counter() - start)
    return times, answers.tolist()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        sock = os.path.join(tmp, "run", "worker.sock")
        proc, ready_s = start_worker(sock, args.threads)
        try:
            http_times, http_answers = trio.run(http_rounds, sock, args.rounds)
            worker_rss = rss_mib(proc.pid)
            with httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://w") as c:
                card = c.get("/v1/models").json()["data"][0]
        finally:
            proc.terminate()
            proc.wait(timeout=20)
    st_times, st_answers = st_rounds(args.threads, args.rounds)
    pairs = zip(http_answers, st_answers, strict=True)
    diff = max(abs(a - b) for x, y in pairs for a, b in zip(x, y, strict=True))

    def summary(times: list[float]) -> dict:
        median = statistics.median(times)
        return {
            "median_round_ms": round(median * 1000, 2),
            "requests_per_s": round(CONCURRENCY / median, 1),
        }

    result = {
        "artifact": ARTIFACT,
        "threads": args.threads,
        "rounds": args.rounds,
        "concurrency": CONCURRENCY,
        "cpu_count": os.cpu_count(),
        "sr_worker_http": summary(http_times),
        "sentence_transformers_encode": summary(st_times),
        "worker_start_to_ready_s": round(ready_s, 2),
        "worker_rss_mib": round(worker_rss, 1),
        "max_abs_diff_vs_sentence_transformers": diff,
        "worker_batching": card["batching"],
    }
    rows = [
        ("sr worker, 32 concurrent HTTP requests (UDS)", result["sr_worker_http"]),
        ("sentence-transformers encode(batch_size=32)", result["sentence_transformers_encode"]),
    ]
    print(f"{'path':48} {'median round ms':>16} {'req/s':>8}")
    for name, s in rows:
        print(f"{name:48} {s['median_round_ms']:>16} {s['requests_per_s']:>8}")
    print(
        f"worker start-to-ready {ready_s:.2f} s, RSS {worker_rss:.0f} MiB, "
        f"max |diff| vs sentence-transformers {diff:.2e}, "
        f"cross-request batching {card['batching']['cross_request']}"
    )
    out = Path(__file__).parent / "results" / "worker_http.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
