"""Router-to-worker client: sr.http.client (its own strict HTTP/1.1 over trio) against httpx,
same worker.

    python -m bench.bench_transport [--rounds 20] [--per-round 100] [--baseline REV]

One `sr worker` (tiny BERT, so the model costs little) on a Unix socket; both clients send
POST /v1/embeddings at concurrency 1 in alternating rounds, so host noise hits both alike.
Reports latency percentiles and the client's own CPU time per request (this process's CPU
clock), which is what the router pays per hop. `--baseline REV` adds sr/http/client.py as
it was at git revision REV as a third client ("http1@REV"), for before/after comparisons
under the same noise. Writes bench/results/transport.json.
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import tempfile
import time
import types
from pathlib import Path

import trio

from bench.harness import WorkerProcess, latency_summary, print_table, tiny_artifact, write_result
from sr.http.client import Http1Pool
from sr.pool.transport import HttpxTransport

_counter = itertools.count()


async def one_round(transport, per_round: int, latencies: list[float]) -> float:
    """Run `per_round` sequential requests; returns this process's CPU seconds spent."""
    cpu = time.process_time()
    for _ in range(per_round):
        body = b'{"input": "transport benchmark %d"}' % next(_counter)
        started = time.perf_counter()
        status, _, _ = await transport.exchange("POST", "/v1/embeddings", body)
        latencies.append(time.perf_counter() - started)
        if status != 200:
            raise SystemExit(f"worker answered {status}")
    return time.process_time() - cpu


class PoolTransport:
    """An `Http1Pool` (of this tree or of a past revision) behind the transport interface."""

    def __init__(self, pool) -> None:
        self.pool = pool

    async def exchange(self, method: str, path: str, body: bytes = b""):
        return await self.pool.request(method, path, body)

    async def aclose(self) -> None:
        await self.pool.aclose()


def pool_class_at(revision: str) -> type:
    """`Http1Pool` from sr/http/client.py as committed at `revision`."""
    source = subprocess.run(
        ["git", "show", f"{revision}:sr/http/client.py"], capture_output=True, check=True
    ).stdout
    module = types.ModuleType(f"http1_at_{revision}")
    exec(compile(source, f"sr/http/client.py@{revision}", "exec"), module.__dict__)
    return module.Http1Pool


async def compare(socket: str, rounds: int, per_round: int, baseline: str | None) -> dict:
    clients = {
        "http1": PoolTransport(Http1Pool(uds=socket)),
        "httpx": HttpxTransport(uds=socket),
    }
    if baseline:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", baseline], capture_output=True, check=True, text=True
        ).stdout.strip()  # a name that stays meaningful after HEAD moves
        clients[f"http1@{commit}"] = PoolTransport(pool_class_at(commit)(uds=socket))
    latencies: dict[str, list[float]] = {name: [] for name in clients}
    cpu: dict[str, float] = dict.fromkeys(clients, 0.0)
    walls: dict[str, float] = dict.fromkeys(clients, 0.0)
    for client in clients.values():  # warm-up: connections, worker caches
        await one_round(client, 20, [])
    for r in range(rounds):
        order = list(clients)[r % len(clients) :] + list(clients)[: r % len(clients)]
        for name in order:
            wall = time.perf_counter()
            cpu[name] += await one_round(clients[name], per_round, latencies[name])
            walls[name] += time.perf_counter() - wall
    for client in clients.values():
        await client.aclose()
    out = {}
    for name in clients:
        row = latency_summary(latencies[name], walls[name])
        row["client_cpu_us_per_request"] = round(cpu[name] / len(latencies[name]) * 1e6, 1)
        out[name] = row
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--baseline", help="git revision of sr/http/client.py to compare")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sr-bench-") as tmp:
        artifact = tiny_artifact(Path(tmp))
        with WorkerProcess(artifact, Path(tmp)) as worker:
            rows = trio.run(compare, worker.socket, args.rounds, args.per_round, args.baseline)
    print_table(
        ("client", "p50 ms", "p90 ms", "p99 ms", "req/s", "client CPU us/req"),
        [
            (name, r["p50_ms"], r["p90_ms"], r["p99_ms"], r["throughput_rps"],
             r["client_cpu_us_per_request"])
            for name, r in rows.items()
        ],
    )  # fmt: skip
    result = {"benchmark": "router-to-worker client", "rounds": args.rounds, "clients": rows}
    if args.baseline:
        result["baseline"] = args.baseline
    write_result("transport", result)
    return result


if __name__ == "__main__":
    main()
