"""Worker HTTP server: hypercorn (ASGI) against sr's h11 server, same service, same model.

    python -m bench.bench_worker_server [--rounds 6] [--per-round 300]

Two worker processes on Unix sockets serve one tiny BERT: `sr worker` (served by sr.http.server)
and a copy of the worker served by hypercorn through a plain ASGI adapter, as the worker was
served until the h11 server replaced it (kept here so the comparison can be rerun). Requests
go through `sr.http.client` (the router's client) at concurrency 1 and 32, for GET /health and
POST /v1/embeddings; the two servers alternate round by round. Reports the worker process's
CPU per request (/proc utime+stime), latency percentiles and throughput.
Writes bench/results/worker_server.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from bench.harness import (
    _pythonpath,
    cpu_seconds,
    http_client,
    latency_summary,
    print_table,
    tiny_artifact,
    unique_text,
    write_result,
)
from sr.errors import TransportError

SERVERS = ("hypercorn", "h1")


def _asgi_app(service):
    """The worker's ASGI face as it was under hypercorn (sr/worker/http.py before the h11
    server)."""
    from sr.errors import RequestError
    from sr.http.asgi import ClientDisconnected, read_body, request_headers, serve_lifespan
    from sr.worker.service import JSON_HEADERS
    from sr.worker.validation import MAX_BODY_BYTES

    async def app(scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        (content_length,) = request_headers(scope, b"content-length")
        try:
            body = await read_body(receive, content_length, MAX_BODY_BYTES)
        except ClientDisconnected:
            return
        except RequestError as error:
            status, headers, payload = error.status, JSON_HEADERS, error.body()
        else:
            status, headers, payload = await service.handle(scope["method"], scope["path"], body)
        length = (b"content-length", str(len(payload)).encode())
        await send({"type": "http.response.start", "status": status, "headers": [*headers, length]})
        await send({"type": "http.response.body", "body": payload})

    return app


async def _serve_hypercorn(artifact: str, uds: str) -> None:
    from hypercorn.config import Config
    from hypercorn.trio import serve

    from sr.worker.options import WorkerOptions
    from sr.worker.service import WorkerService

    service = WorkerService(WorkerOptions(artifact=artifact, threads=1))
    config = Config()
    config.keep_alive_timeout = 75.0
    config.accesslog = None
    config.errorlog = None
    config.include_server_header = False
    config.bind = [f"unix:{uds}"]
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await serve(_asgi_app(service), config)


def start_worker(server: str, artifact: str, uds: str) -> subprocess.Popen:
    if server == "h1":
        argv = [sys.executable, "-m", "sr", "worker", "--artifact", artifact, "--uds", uds]
    else:
        argv = [sys.executable, "-m", "bench.bench_worker_server", "--child", artifact, uds]
    env = {**os.environ, "PYTHONPATH": _pythonpath()}
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def wait_ready(client, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"worker exited with {proc.returncode}")
        try:
            status, _, _ = await client.request("GET", "/health")
            if status == 200:
                return
        except (OSError, TransportError):  # the socket is not up yet
            pass
        await trio.sleep(0.1)
    raise SystemExit("worker not ready in time")


async def one_round(client, endpoint: str, concurrency: int, total: int) -> tuple[list, float]:
    latencies: list[float] = []
    left = total

    async def caller() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            if endpoint == "health":
                method, path, body = "GET", "/health", b""
            else:
                method, path = "POST", "/v1/embeddings"
                body = json.dumps({"input": unique_text("server")}).encode()
            started = time.perf_counter()
            status, _, _ = await client.request(method, path, body)
            latencies.append(time.perf_counter() - started)
            if status != 200:
                raise SystemExit(f"worker answered {status} on {path}")

    wall = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(caller)
    return latencies, time.perf_counter() - wall


async def compare(procs: dict, sockets: dict, rounds: int, per_round: int) -> list[dict]:
    clients = {name: http_client(sockets[name]) for name in SERVERS}
    for name in SERVERS:
        await wait_ready(clients[name], procs[name])
        await one_round(clients[name], "embeddings", 4, 100)  # warm-up
    rows = []
    for endpoint in ("health", "embeddings"):
        for concurrency in (1, 32):
            latencies = {name: [] for name in SERVERS}
            wall = dict.fromkeys(SERVERS, 0.0)
            cpu = dict.fromkeys(SERVERS, 0.0)
            for r in range(rounds):
                for name in SERVERS if r % 2 == 0 else SERVERS[::-1]:
                    before = cpu_seconds(procs[name].pid)
                    lat, took = await one_round(clients[name], endpoint, concurrency, per_round)
                    cpu[name] += cpu_seconds(procs[name].pid) - before
                    latencies[name] += lat
                    wall[name] += took
            for name in SERVERS:
                row = latency_summary(latencies[name], wall[name])
                row.update(endpoint=endpoint, concurrency=concurrency, server=name)
                row["worker_cpu_us_per_request"] = round(cpu[name] / len(latencies[name]) * 1e6)
                rows.append(row)
    for client in clients.values():
        await client.aclose()
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--per-round", type=int, default=300)
    parser.add_argument("--child", nargs=2, metavar=("ARTIFACT", "UDS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        trio.run(_serve_hypercorn, *args.child)
        return {}
    with tempfile.TemporaryDirectory(prefix="sr-bench-") as tmp:
        artifact = tiny_artifact(Path(tmp))
        sockets = {name: f"{tmp}/{name}.sock" for name in SERVERS}
        procs = {name: start_worker(name, artifact, sockets[name]) for name in SERVERS}
        try:
            rows = trio.run(compare, procs, sockets, args.rounds, args.per_round)
        finally:
            for proc in procs.values():
                proc.terminate()
                proc.wait(timeout=20)
    print_table(
        ("endpoint", "conc", "server", "worker CPU us/req", "p50 ms", "p99 ms", "req/s"),
        [
            (r["endpoint"], r["concurrency"], r["server"], r["worker_cpu_us_per_request"],
             r["p50_ms"], r["p99_ms"], r["throughput_rps"])
            for r in rows
        ],
    )  # fmt: skip
    result = {"benchmark": "worker HTTP server", "rounds": args.rounds, "rows": rows}
    write_result("worker_server", result)
    return result


if __name__ == "__main__":
    main()
