"""Latency through `sr serve` with traces off, on (a collector that answers) and on with a
collector that hangs: traces must cost a request nothing it waits for.

    python -m bench.bench_traces [--rounds 5] [--requests 200] [--model minilm|tiny]

Three `sr serve` processes on the embedded MiniLM (or the tiny BERT, whose ~1 ms requests
show the spans' own cost at its largest; one CPU worker each, result cache off) run
side by side; round by round, one caller sends `--requests` sequential POST /v1/embeddings
(a new text each, with a caller's `traceparent`) to each in turn. The collectors are
OTLP/HTTP receivers in this process: one answers every export at once, the other reads it
and never answers (the SDK's exporting thread then waits out its timeout, and its queue
drops spans once full). Target: p50 and p90 with the hung collector within 5 % of traces
off. Writes bench/results/traces-MODEL.json.
"""

from __future__ import annotations

import argparse
import json
import secrets
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import trio

from bench.harness import (
    ServeProcess,
    embedded_artifact,
    http_client,
    latency_summary,
    print_table,
    tiny_artifact,
    unique_text,
    write_result,
)

TARGET = 1.05
SETUPS = ("off", "on", "on, collector hung")


def collector(hang: bool, release: threading.Event) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # http.server's name
            self.rfile.read(int(self.headers.get("content-length") or 0))
            if hang:
                release.wait(600)
                return
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


async def one_round(url: str, requests: int) -> list[float]:
    client = http_client(url)
    latencies = []
    try:
        for _ in range(requests):
            body = json.dumps({"model": "primary", "input": unique_text("traces")}).encode()
            parent = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
            started = time.perf_counter()
            status, _, payload = await client.request(
                "POST", "/v1/embeddings", body, traceparent=parent
            )
            latencies.append(time.perf_counter() - started)
            if status != 200:
                raise SystemExit(f"sr serve answered {status}: {payload[:200]!r}")
    finally:
        await client.aclose()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--model", choices=("minilm", "tiny"), default="minilm")
    args = parser.parse_args()
    release = threading.Event()
    answering, hung = collector(False, release), collector(True, release)
    fast = {"OTEL_BSP_SCHEDULE_DELAY": "100"}  # export often: the hung one is hit at once
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        artifact = embedded_artifact() if args.model == "minilm" else tiny_artifact(workdir)

        def traced(server: ThreadingHTTPServer) -> ServeProcess:
            endpoint = f"http://127.0.0.1:{server.server_address[1]}"
            return ServeProcess(artifact, workdir, args=["--otlp-endpoint", endpoint], env=fast)

        servers = {
            "off": ServeProcess(artifact, workdir),
            "on": traced(answering),
            "on, collector hung": traced(hung),
        }
        latencies: dict[str, list[float]] = {name: [] for name in SETUPS}
        try:
            for server in servers.values():
                server.wait_ready()
            for name in SETUPS:  # warm-up: first connections, first forwards
                trio.run(one_round, servers[name].url, 20)
            for _ in range(args.rounds):
                for name in SETUPS:
                    latencies[name] += trio.run(one_round, servers[name].url, args.requests)
        finally:
            for server in servers.values():
                server.stop()
            release.set()
    summaries = {name: latency_summary(latencies[name], 1.0) for name in SETUPS}
    base = summaries["off"]
    rows = []
    for name in SETUPS:
        s = summaries[name]
        rows.append((name, s["requests"], s["p50_ms"], s["p90_ms"], s["p99_ms"],
                     s["p50_ms"] / base["p50_ms"], s["p90_ms"] / base["p90_ms"]))  # fmt: skip
    print_table(("traces", "requests", "p50 ms", "p90 ms", "p99 ms", "p50 / off", "p90 / off"),
                rows)  # fmt: skip
    hung_ratio = summaries["on, collector hung"]["p50_ms"] / base["p50_ms"]
    print(f"target: hung collector p50 <= {TARGET:.2f}x traces off: "
          f"{'met' if hung_ratio <= TARGET else 'NOT met'} ({hung_ratio:.3f}x)")  # fmt: skip
    write_result(f"traces-{args.model}",
                 {"setups": summaries, "target": TARGET, "hung_p50_ratio": hung_ratio})  # fmt: skip


if __name__ == "__main__":
    main()
