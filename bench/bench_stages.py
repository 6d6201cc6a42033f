"""Where one request's time goes, stage by stage, through a real `sr serve`.

    python -m bench.bench_stages [--requests 300] [--artifact DIR] [--engine onnxruntime]

`sr serve` on the embedded MiniLM (or --artifact), one CPU worker at 1 thread on the torch
engine (or --engine's), result cache off. One client sends one request at a time, `POST
/v1/embeddings` with a new short text each (about 10 tokens: bench_onnx's "one short text",
from the same corpus), alternating between the router (TCP) and the worker itself (its Unix
socket).
The worker's own clock comes off each direct answer's `x-sr-timing` (microseconds,
sr.worker.timing; the router does not pass it on). Medians per stage:

* client wall time, through the router and straight to the worker;
* router and hop: the first less the second (parse, admission, dispatch, the hop's bytes,
  the relay);
* the worker's stages from its clock: parse, validation and tokenization (until the rows
  reach the engine), queue hand-off (until the device thread's forward starts), forward,
  and the rest of the worker's handling (answer encoding);
* the worker's HTTP path outside its handler: the direct wall time less the worker's
  total (the client's own time on the socket is in it too).

Writes bench/results/stages.json. Instructions per request of the two processes:
bench/bench_request_instructions.py.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import trio

from bench.bench_profile import case_texts
from bench.harness import (
    ServeProcess,
    embedded_artifact,
    http_client,
    print_table,
    write_result,
)
from sr.models import resolve_artifact
from sr.models.encoder import load_tokenizer


def _timing(headers: dict[str, str]) -> list[int]:
    """total, tokenization, queue, inference (microseconds) from a worker's answer."""
    fields = headers["x-sr-timing"].split()
    return [int(value) for value in fields[:4]]


async def measure(router_url: str, worker_socket: str, artifact: str, requests: int) -> dict:
    router, worker = http_client(router_url), http_client(worker_socket)
    rows: dict[str, list[float]] = {
        name: []
        for name in ("router_wall", "direct_wall", "total", "tokenization", "queue", "inference")
    }
    tokenizer = load_tokenizer(resolve_artifact(artifact))
    for number in range(requests + 20):  # the first 20 warm both paths up
        order = ("router", "direct") if number % 2 == 0 else ("direct", "router")
        for path in order:
            client, model = (router, "primary") if path == "router" else (worker, artifact)
            # Never sent before: each text ends in its own tag, so no cache answers it.
            serial = 2 * number + (path == "direct")
            text = case_texts(tokenizer, "short", 1, serial=serial)[0]
            body = json.dumps({"model": model, "input": text}).encode()
            started = time.perf_counter()
            status, headers, _ = await client.request("POST", "/v1/embeddings", body)
            wall = time.perf_counter() - started
            if status != 200:
                raise SystemExit(f"{path} answered {status}")
            if number < 20:
                continue
            rows[f"{path}_wall"].append(wall * 1e6)
            if path == "direct":
                for name, value in zip(
                    ("total", "tokenization", "queue", "inference"), _timing(headers), strict=True
                ):
                    rows[name].append(value)
    await router.aclose()
    await worker.aclose()
    return {name: statistics.median(values) for name, values in rows.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--artifact", default=None, help="default: the embedded MiniLM")
    parser.add_argument("--engine", choices=("torch", "onnxruntime"), default="torch")
    args = parser.parse_args()
    artifact = args.artifact or embedded_artifact()
    with (
        tempfile.TemporaryDirectory(prefix="sr-stages-") as workdir,
        ServeProcess(artifact, Path(workdir), engine=args.engine) as serve,
    ):
        medians = trio.run(
            measure, serve.url, serve.worker_sockets[0], serve.served_artifact, args.requests
        )
    us = medians  # microseconds
    worker_rest = us["total"] - us["tokenization"] - us["queue"] - us["inference"]
    stages = [
        ("client wall, through sr serve", us["router_wall"]),
        ("client wall, straight to the worker", us["direct_wall"]),
        ("router and hop (the two walls' difference)", us["router_wall"] - us["direct_wall"]),
        ("worker HTTP path outside its handler, client included", us["direct_wall"] - us["total"]),
        ("worker: parse, validation, tokenization", us["tokenization"]),
        ("worker: queue hand-off to the device thread", us["queue"]),
        ("worker: forward", us["inference"]),
        ("worker: the rest of its handling (answer encoding)", worker_rest),
    ]
    print_table(["stage (median)", "ms"], [[name, f"{value / 1000:.3f}"] for name, value in stages])
    write_result(
        "stages",
        {"artifact": artifact, "engine": args.engine, "requests": args.requests,
         "stages_ms": {name: round(value / 1000, 4) for name, value in stages}},
    )  # fmt: skip


if __name__ == "__main__":
    main()
