"""Worker HTTP API vs sentence-transformers in-process, on the embedded MiniLM.

32 concurrent short requests (one input each) through `sr worker` over a Unix socket,
against `SentenceTransformer.encode(texts, batch_size=32)` in this process, both at the
same torch thread count. The sides alternate round by round (same inputs within a round,
fresh inputs every round so the worker's result cache never answers), so host noise lands
on both. Also measures the worker's start-to-ready time and RSS, and the
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

from bench.harness import http_client

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


def round_texts(round_no: int) -> list[str]:
    # Same inputs for both sides within a round; a per-round suffix keeps the worker's
    # result cache from answering any later round. Round 0 is unsuffixed (the answers).
    suffix = "" if round_no == 0 else f" #{round_no}"
    return [t + suffix for t in TEXTS]


def load_st(threads: int):
    import torch
    from sentence_transformers import SentenceTransformer

    from sr.models import resolve_artifact

    # Same torch thread count as the worker's --threads.
    torch.set_num_threads(threads)
    return SentenceTransformer(str(resolve_artifact(ARTIFACT)), device="cpu")


async def http_round(client, texts: list[str]) -> tuple[float, list]:
    answers: list[list[float]] = [[] for _ in texts]

    async def one(i: int) -> None:
        body = json.dumps({"input": texts[i]}).encode()
        status, _, payload = await client.request("POST", "/v1/embeddings", body)
        if status != 200:
            raise SystemExit(f"worker answered {status}: {payload[:200]!r}")
        answers[i] = json.loads(payload)["data"][0]["embedding"]

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(len(texts)):
            nursery.start_soon(one, i)
    return time.perf_counter() - start, answers


def st_round(model, texts: list[str]) -> tuple[float, list]:
    start = time.perf_counter()
    answers = model.encode(texts, batch_size=CONCURRENCY, convert_to_numpy=True)
    return time.perf_counter() - start, answers.tolist()


async def interleave(sock: str, model, rounds: int) -> dict:
    """Alternate the two sides round by round so host noise lands on both alike."""
    # The cheap sr.http.client client (as bench_serve_st uses): httpx's per-request cost
    # would take the shared CPUs from the worker and land on the worker side only.
    client = http_client(sock)
    try:
        # Round 0 warms both sides up and records the unsuffixed answers for the diff.
        _, http_answers = await http_round(client, round_texts(0))
        _, st_answers = st_round(model, round_texts(0))
        times: dict[str, list[float]] = {"http": [], "st": []}
        for r in range(1, rounds + 1):
            texts = round_texts(r)
            for side in ("http", "st") if r % 2 else ("st", "http"):
                if side == "http":
                    times["http"].append((await http_round(client, texts))[0])
                else:
                    times["st"].append(st_round(model, texts)[0])
    finally:
        await client.aclose()
    return {"times": times, "http_answers": http_answers, "st_answers": st_answers}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    model = load_st(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        sock = os.path.join(tmp, "run", "worker.sock")
        proc, ready_s = start_worker(sock, args.threads)
        try:
            run = trio.run(interleave, sock, model, args.rounds)
            worker_rss = rss_mib(proc.pid)
            with httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://w") as c:
                card = c.get("/v1/models").json()["data"][0]
        finally:
            proc.terminate()
            proc.wait(timeout=20)
    http_times, st_times = run["times"]["http"], run["times"]["st"]
    pairs = zip(run["http_answers"], run["st_answers"], strict=True)
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
        "ratio": round(statistics.median(st_times) / statistics.median(http_times), 3),
        "interleaved": True,
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
        f"ratio (worker req/s / encode req/s) {result['ratio']}, sides alternated per round; "
        f"worker start-to-ready {ready_s:.2f} s, RSS {worker_rss:.0f} MiB, "
        f"max |diff| vs sentence-transformers {diff:.2e}, "
        f"cross-request batching {card['batching']['cross_request']}"
    )
    out = Path(__file__).parent / "results" / "worker_http.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
