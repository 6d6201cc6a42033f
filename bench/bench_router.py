"""Router hop overhead: latency and throughput through `sr serve` vs straight to its worker.

    python -m bench.bench_router [--seconds 2] [--rounds 3] [--artifact DIR]

Starts `sr serve` with one CPU worker of a tiny BERT (generated unless --artifact is given),
result cache off and a unique input per request (so neither router nor worker caches answer),
then drives the same /v1/embeddings load through the router (loopback TCP) and directly to
its worker (the worker's Unix socket), alternating the two in rounds at each concurrency so
that host noise hits both alike. The load generator is sr.http.client for both paths. The
router's overhead is the difference of the percentiles; targets at concurrency 1: p50 <=
0.6 ms, p99 <= 2 ms. Also reports the router process's CPU time per request.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import trio

from bench.harness import (
    ServeProcess,
    cpu_seconds,
    drive,
    http_client,
    latency_summary,
    merge_runs,
    print_table,
    tiny_artifact,
    unique_text,
    write_result,
)

CONCURRENCY = (1, 8, 64)
P50_TARGET_MS = 0.6
P99_TARGET_MS = 2.0


async def alternate(router, direct, artifact: str, seconds: float) -> dict[str, dict]:
    """One caller, requests alternating between the two paths (swapping which goes first
    every pair), so that any burst of host noise lands on both."""
    latencies: dict[str, list[float]] = {"router": [], "direct": []}
    busy: dict[str, float] = {"router": 0.0, "direct": 0.0}
    targets = {"router": (router, "primary"), "direct": (direct, artifact)}
    end = time.perf_counter() + seconds
    turn = 0
    while time.perf_counter() < end:
        order = ("router", "direct") if turn % 2 == 0 else ("direct", "router")
        turn += 1
        for path in order:
            client, model = targets[path]
            body = json.dumps({"model": model, "input": unique_text("hop")}).encode()
            started = time.perf_counter()
            status, _, _ = await client.request("POST", "/v1/embeddings", body)
            elapsed = time.perf_counter() - started
            if status != 200:
                raise SystemExit(f"{path} answered {status}")
            latencies[path].append(elapsed)
            busy[path] += elapsed
    return {
        path: latency_summary(values, busy[path])
        | {"latencies_ms": sorted(round(v * 1000, 3) for v in values)}
        for path, values in latencies.items()
    }


async def run_all(serve: ServeProcess, seconds: float, rounds: int, levels) -> list[dict]:
    router = http_client(serve.url)
    direct = http_client(serve.worker_sockets[0])
    await drive(router, "primary", 4, 0.5)  # warm connections and both processes
    await drive(direct, serve.served_artifact, 4, 0.5)
    rows = []
    for concurrency in levels:
        runs: dict[str, list[dict]] = {"router": [], "direct": []}
        router_cpu = 0.0
        if concurrency == 1:  # finest interleaving: router and direct take turns per request
            before = cpu_seconds(serve.proc.pid)
            pair = await alternate(router, direct, serve.served_artifact, seconds * rounds * 2)
            router_cpu = cpu_seconds(serve.proc.pid) - before
            runs = {path: [summary] for path, summary in pair.items()}
        for r in range(rounds if concurrency > 1 else 0):
            order = ("router", "direct") if r % 2 == 0 else ("direct", "router")
            for path in order:
                if path == "router":
                    before = cpu_seconds(serve.proc.pid)
                    runs[path].append(await drive(router, "primary", concurrency, seconds))
                    router_cpu += cpu_seconds(serve.proc.pid) - before
                else:
                    model = serve.served_artifact
                    runs[path].append(await drive(direct, model, concurrency, seconds))
        via_router, to_worker = merge_runs(runs["router"]), merge_runs(runs["direct"])
        rows.append(
            {
                "concurrency": concurrency,
                "router": via_router,
                "direct": to_worker,
                "p50_overhead_ms": round(via_router["p50_ms"] - to_worker["p50_ms"], 3),
                "p99_overhead_ms": round(via_router["p99_ms"] - to_worker["p99_ms"], 3),
                "router_cpu_us_per_request": round(
                    router_cpu / max(1, via_router["requests"]) * 1e6, 1
                ),
            }
        )
    await router.aclose()
    await direct.aclose()
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per round, path and level")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--artifact", help="model folder (default: a generated tiny BERT)")
    parser.add_argument("--concurrency", type=int, nargs="*", default=list(CONCURRENCY))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sr-bench-") as tmp:
        artifact = args.artifact or tiny_artifact(Path(tmp))
        with ServeProcess(artifact, Path(tmp)) as serve:
            rows = trio.run(run_all, serve, args.seconds, args.rounds, args.concurrency)
    table = []
    for row in rows:
        for path in ("router", "direct"):
            r = row[path]
            table.append(
                (row["concurrency"], path, r["p50_ms"], r["p90_ms"], r["p99_ms"],
                 r["throughput_rps"], r["errors"])
            )  # fmt: skip
        table.append(
            ("", "overhead", row["p50_overhead_ms"], "", row["p99_overhead_ms"],
             f"router CPU {row['router_cpu_us_per_request']} us/req", "")
        )  # fmt: skip
    print_table(("conc", "path", "p50 ms", "p90 ms", "p99 ms", "req/s", "errors"), table)
    result = {
        "benchmark": "router_hop",
        "artifact": "tiny-bert" if args.artifact is None else args.artifact,
        "seconds_per_round": args.seconds,
        "rounds": args.rounds,
        "targets": {"p50_overhead_ms": P50_TARGET_MS, "p99_overhead_ms": P99_TARGET_MS},
        "rows": [
            {**row, "router": _strip(row["router"]), "direct": _strip(row["direct"])}
            for row in rows
        ],
    }
    write_result("router", result)
    return result


def _strip(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "latencies_ms"}


if __name__ == "__main__":
    main()
