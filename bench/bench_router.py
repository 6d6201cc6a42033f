"""Router hop overhead: latency and throughput through `sr serve` vs straight to its worker.

    python bench/bench_router.py [--seconds 3] [--artifact DIR]
    # prints a table, writes bench/results/router.json

Starts `sr serve` with one CPU worker of a tiny BERT (generated unless --artifact is given),
result cache off and a unique input per request (so neither router nor worker caches answer),
then drives the same /v1/embeddings load at concurrency 1, 8 and 64 through the router
(loopback TCP) and directly to the worker (its Unix socket). The router's own overhead is the
difference of the p50s; the target is <= 0.6 ms.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # running from a checkout that is not installed
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import trio  # noqa: E402

CONCURRENCY = (1, 8, 64)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_router(artifact: str, workdir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    config = workdir / "config.yaml"
    config.write_text(
        "global:\n  model_catalog:\n    deployments:\n      primary:\n"
        f"        artifact: {json.dumps(artifact)}\n        replicas: [{{device: cpu}}]\n"
        f"listeners:\n  - {{host: 127.0.0.1, port: {port}}}\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_SRUN_RESULT_CACHE": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sr", "serve", "--config", str(config), "--port", str(port)],
        cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"sr serve exited with {proc.returncode}")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("sr serve did not become ready in 120 s")


def worker_socket(url: str) -> tuple[str, str]:
    inventory = httpx.get(url + "/api/v1/inventory/model-runtime").json()
    replica = inventory["deployments"]["primary"]["replicas"][0]
    args = Path(f"/proc/{replica['pid']}/cmdline").read_bytes().split(b"\0")
    return args[args.index(b"--uds") + 1].decode(), inventory["deployments"]["primary"]["artifact"]


async def drive(client: httpx.AsyncClient, model: str, concurrency: int, seconds: float):
    latencies: list[float] = []
    counter = itertools.count()
    errors = 0

    async def caller() -> None:
        nonlocal errors
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            body = {"model": model, "input": f"benchmark sentence number {next(counter)}"}
            started = time.perf_counter()
            answer = await client.post("/v1/embeddings", json=body)
            if answer.status_code == 200:
                latencies.append(time.perf_counter() - started)
            else:
                errors += 1

    wall = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(caller)
    wall = time.perf_counter() - wall
    latencies.sort()

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000

    return {
        "requests": len(latencies),
        "errors": errors,
        "p50_ms": round(pct(0.50), 3),
        "p99_ms": round(pct(0.99), 3),
        "throughput_rps": round(len(latencies) / wall, 1),
    }


async def run_all(url: str, uds: str, artifact: str, seconds: float) -> list[dict]:
    limits = httpx.Limits(max_connections=128, max_keepalive_connections=128)
    router = httpx.AsyncClient(base_url=url, limits=limits, timeout=30)
    direct = httpx.AsyncClient(
        base_url="http://worker", transport=httpx.AsyncHTTPTransport(uds=uds, limits=limits),
        timeout=30,
    )  # fmt: skip
    rows = []
    async with router, direct:
        await drive(router, "primary", 4, 0.5)  # warm connections and both processes
        await drive(direct, artifact, 4, 0.5)
        for concurrency in CONCURRENCY:
            via_router = await drive(router, "primary", concurrency, seconds)
            to_worker = await drive(direct, artifact, concurrency, seconds)
            rows.append(
                {
                    "concurrency": concurrency,
                    "router": via_router,
                    "direct": to_worker,
                    "p50_overhead_ms": round(via_router["p50_ms"] - to_worker["p50_ms"], 3),
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per concurrency and path")
    parser.add_argument("--artifact", help="model folder (default: a generated tiny BERT)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sr-bench-") as tmp:
        workdir = Path(tmp)
        artifact = args.artifact
        if artifact is None:
            from sr.models.testing import write_tiny_bert

            artifact = str(write_tiny_bert(workdir / "tiny", seed=0))
        proc, url = start_router(artifact, workdir)
        try:
            uds, served_artifact = worker_socket(url)
            rows = trio.run(run_all, url, uds, served_artifact, args.seconds)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
    header = f"{'conc':>4}  {'path':<7} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} {'errors':>6}"
    print(header)
    for row in rows:
        for path in ("router", "direct"):
            r = row[path]
            print(
                f"{row['concurrency']:>4}  {path:<7} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f}"
                f" {r['throughput_rps']:>8.1f} {r['errors']:>6}"
            )
        print(f"{'':>4}  p50 overhead {row['p50_overhead_ms']:.3f} ms")
    out = ROOT / "bench" / "results" / "router.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "router_hop",
        "artifact": "tiny-bert" if args.artifact is None else args.artifact,
        "seconds_per_cell": args.seconds,
        "host": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "rows": rows,
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
