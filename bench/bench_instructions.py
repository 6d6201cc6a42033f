"""CPU instructions per request of sr's HTTP server, this checkout against a baseline revision.

    python -m bench.bench_instructions --baseline REV [--runs 3]

Why: on this shared 2-core host a timed comparison of two revisions moves by 10-30 % from
run to run (bench/bench_revisions.py's per-pair ratios), so a change of a few percent in
the server's cost cannot be seen in time. Instructions executed are nearly deterministic:
valgrind's callgrind counts them (user space only; time in the kernel is not counted).

What runs: sr.http.server with a handler that answers at once, as the worker serves
`/health`, on a Unix socket in this process (the one traced), and a client in a separate,
untraced process that sends one request, reads its answer, and sends the next
(concurrency 1, so every request's read has to wait, as a pool's health probe does).
Two paths: `GET /health` (no body) and `POST /v1/embeddings` with a 38-byte body. Each
count is taken twice, with 500 and 2,500 requests, and the difference divided by 2,000:
what one request costs, without start-up. Sides alternate, candidate first in odd pairs.

Needs valgrind on PATH. Writes bench/results/instructions.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.bench_revisions import export_tree, schedule
from bench.harness import ROOT, host_info, print_table, write_result

SHORT, LONG = 500, 2500
_BODY = b'{"input": "a short sentence to embed"}'
PATHS = {
    "GET /health": b"GET /health HTTP/1.1\r\nhost: w\r\n\r\n",
    "POST /v1/embeddings": (
        b"POST /v1/embeddings HTTP/1.1\r\nhost: w\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(_BODY), _BODY)
    ),
}


def _serve(tree: str, requests: int, path: str) -> None:
    """The traced process: the server of `tree`, until the client has sent `requests`."""
    sys.path.insert(0, tree)
    import trio

    try:
        from sr.http.server import H1Server, open_listeners
    except ImportError:  # a tree from before the HTTP stack moved into sr/http
        from sr.h1_server import H1Server, open_listeners

    async def handler(method: str, target: str, body: bytes, *headers):  # either tree's form
        return 200, [(b"content-type", b"application/json")], b'{"status":"ok"}'

    async def main() -> None:
        uds = os.path.join(tempfile.mkdtemp(prefix="sr-instr-"), "s.sock")
        listeners, _ = await open_listeners(uds=uds)
        async with trio.open_nursery() as nursery:
            await nursery.start(H1Server(handler).serve, listeners)
            client = [sys.executable, "-m", "bench.bench_instructions", "--client", uds,
                      str(requests), path]  # fmt: skip
            await trio.run_process(client, cwd=str(ROOT))
            nursery.cancel_scope.cancel()
        shutil.rmtree(os.path.dirname(uds))

    trio.run(main)


def _client(uds: str, requests: int, path: str) -> None:
    """Plain blocking client: one request at a time, each answer read in full."""
    import socket

    wire = PATHS[path]
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(uds)
        for _ in range(requests):
            sock.sendall(wire)
            answer = b""
            while not (b"\r\n\r\n" in answer and answer.endswith(b"}")):
                answer += sock.recv(65536)


def _instructions(tree: Path, requests: int, path: str) -> int:
    command = [
        "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
        sys.executable, "-m", "bench.bench_instructions", "--serve", str(tree),
        str(requests), path,
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    for line in done.stderr.splitlines():
        if "Collected :" in line:
            return int(line.rsplit(":", 1)[1])
    raise SystemExit(f"no callgrind summary in:\n{done.stderr[-2000:]}")


def per_request(tree: Path, path: str) -> float:
    return (_instructions(tree, LONG, path) - _instructions(tree, SHORT, path)) / (LONG - SHORT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", help="a revision of this checkout to compare against")
    parser.add_argument("--runs", type=int, default=3, help="runs per side")
    parser.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--client", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve(args.serve[0], int(args.serve[1]), args.serve[2])
        return
    if args.client:
        _client(args.client[0], int(args.client[1]), args.client[2])
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("bench_instructions needs valgrind (apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="sr-instr-trees-") as scratch:
        trees = {"candidate": ROOT}
        if args.baseline:
            trees["baseline"] = export_tree(args.baseline, Path(scratch))
        order = schedule(args.runs) if args.baseline else ["candidate"] * args.runs
        counts: dict[str, dict[str, list[float]]] = {s: {p: [] for p in PATHS} for s in trees}
        for side in order:
            for path in PATHS:
                counts[side][path].append(per_request(trees[side], path))
                print(f"{side:9s} {path:20s} {counts[side][path][-1]:>10,.0f}", flush=True)
    rows, table = [], []
    for path in PATHS:
        row = {"path": path, **{s: counts[s][path] for s in trees}}
        cells = [path] + [f"{statistics.median(counts[s][path]):,.0f}" for s in trees]
        if "baseline" in trees:
            ratio = statistics.median(counts["candidate"][path]) / statistics.median(
                counts["baseline"][path]
            )
            row["ratio"] = ratio
            cells.append(f"{ratio:.3f}")
        rows.append(row)
        table.append(cells)
    header = ["path", "candidate instr/req"] + (
        ["baseline instr/req", "ratio"] if "baseline" in trees else []
    )
    print_table(header, table)
    write_result(
        "instructions",
        {
            "benchmark": "instructions",
            "baseline": args.baseline,
            "runs_per_side": args.runs,
            "requests": [SHORT, LONG],
            "rows": rows,
            "host": host_info(),
        },
    )


if __name__ == "__main__":
    main()
