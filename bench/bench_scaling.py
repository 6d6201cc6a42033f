"""Throughput against replicas and concurrency through `sr serve`, embedded MiniLM.

    python -m bench.bench_scaling [--seconds 3] [--rounds 2] [--concurrency 1 8 32 64]

Two routers run side by side, one with 1 worker and one with 2 workers, 1 torch thread each;
at each concurrency the two are driven in alternating rounds with short unique inputs. The
target: 2 replicas deliver >= 1.7x the throughput of 1 replica at concurrency 64. Writes
bench/results/scaling.json.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import trio

from bench.harness import (
    ServeProcess,
    drive,
    embedded_artifact,
    http_client,
    merge_runs,
    print_table,
    write_result,
)

TARGET_RATIO = 1.7
TARGET_CONCURRENCY = 64


async def compare(servers: dict[int, ServeProcess], levels, seconds, rounds) -> list[dict]:
    clients = {n: http_client(s.url) for n, s in servers.items()}
    for client in clients.values():
        await drive(client, "primary", 16, 2.0)  # warm-up: every worker, every batch size
    rows = []
    for concurrency in levels:
        runs: dict[int, list[dict]] = {n: [] for n in servers}
        cpu = {n: {"router": 0.0, "workers": 0.0, "load generator": 0.0} for n in servers}
        for r in range(rounds):
            order = sorted(servers) if r % 2 == 0 else sorted(servers, reverse=True)
            for n in order:
                before, mine = servers[n].cpu_seconds(), time.process_time()
                runs[n].append(await drive(clients[n], "primary", concurrency, seconds))
                after = servers[n].cpu_seconds()
                cpu[n]["load generator"] += time.process_time() - mine
                for key in before:
                    cpu[n][key] += after[key] - before[key]
        merged = {n: merge_runs(v) for n, v in runs.items()}
        for n, m in merged.items():  # where the CPU goes, per answer
            answers = max(1, m["requests"])
            m["cpu_us_per_answer"] = {k: round(v / answers * 1e6) for k, v in cpu[n].items()}
        one, two = merged[min(servers)], merged[max(servers)]
        ratio = two["throughput_rps"] / one["throughput_rps"] if one["throughput_rps"] else 0
        rows.append(
            {
                "concurrency": concurrency,
                "by_replicas": {str(n): m for n, m in merged.items()},
                "ratio": round(ratio, 3),
            }
        )
    for client in clients.values():
        await client.aclose()
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 8, 32, 64])
    args = parser.parse_args(argv)
    artifact = embedded_artifact()
    with tempfile.TemporaryDirectory(prefix="sr-bench-") as tmp:
        one = ServeProcess(artifact, Path(tmp), replicas=1, threads=1)
        two = ServeProcess(artifact, Path(tmp), replicas=2, threads=1)
        try:
            servers = {1: one.wait_ready(), 2: two.wait_ready()}
            rows = trio.run(compare, servers, args.concurrency, args.seconds, args.rounds)
        finally:
            one.stop()
            two.stop()
    table = []
    for row in rows:
        for n, m in row["by_replicas"].items():
            c = m["cpu_us_per_answer"]
            table.append(
                (row["concurrency"], n, m["throughput_rps"], m["p50_ms"], m["p99_ms"],
                 m["errors"], c["router"], c["workers"], c["load generator"])
            )  # fmt: skip
        table.append(("", "2 vs 1", f"x{row['ratio']:.2f}", "", "", "", "", "", ""))
    print_table(
        ("conc", "replicas", "req/s", "p50 ms", "p99 ms", "turned away", "router CPU us/ans",
         "workers CPU us/ans", "loadgen CPU us/ans"),
        table,
    )  # fmt: skip
    result = {
        "benchmark": "scaling",
        "artifact": artifact,
        "threads_per_worker": 1,
        "seconds_per_round": args.seconds,
        "rounds": args.rounds,
        "target": {"concurrency": TARGET_CONCURRENCY, "ratio": TARGET_RATIO},
        "rows": rows,
    }
    write_result("scaling", result)
    return result


if __name__ == "__main__":
    main()
