"""Cold start: `sr serve` on the embedded default model, from launch to its first 200.

    python -m bench.bench_cold_start [--baseline REV] [--runs 4] [--first-starts 1]

What a user waits for after `sr serve`: the process is started with one CPU worker (1
thread) and a fresh config file, and a client sends `POST /v1/embeddings` every 20 ms
(connection refused, 503 and 404 all count as "not yet") until one answers 200. Reported per
run: seconds to the listener's first answer (`/health`), to the first 200, and the import
time of `sr.router.serve` in a fresh interpreter (the router's own code, before any worker
exists). From each run's JSON log: seconds to the model's fork server ready (torch and sr
imported, the model loaded) and the worker's warm-up (golden check, batching probe,
calibration), so a start's time splits into imports, load, warm-up and the rest. With
`--baseline REV` the same is run on `git archive REV`, sides alternating (C B B C ...), so
host noise hits both alike; ratios are candidate / baseline.

Each run uses its own TMPDIR, so no run finds another's sockets; nothing is cached between
runs by sr itself unless the tree under test caches on purpose (its cache directory is
then kept across that side's runs, as a user's would be; the first `--first-starts` runs of
each side, 1 by default, each start on an empty one, a host's first start, reported apart).

Writes bench/results/cold_start.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_revisions import export_tree, schedule
from bench.harness import ROOT, free_port, print_table, write_result

_BODY = b'{"model": "primary", "input": "cold start"}'
_POLL_S = 0.02
_TIMEOUT_S = 120.0


def _status(port: int, method: bytes, path: bytes, body: bytes = b"") -> int | None:
    """The status of one request on a fresh connection, None if nothing answers."""
    head = b"%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" % (method, path)
    if body:
        head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(head + b"\r\n" + body)
            answer = sock.recv(64)
    except OSError:
        return None
    parts = answer.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


def import_seconds(tree: Path) -> float:
    """Wall seconds of `import sr.router.serve` in a fresh interpreter (median of 3)."""
    code = "import time; t = time.perf_counter(); import sr.router.serve; " \
        "print(time.perf_counter() - t)"  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}
    times = []
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, check=True,
                              capture_output=True, text=True)  # fmt: skip
        times.append(float(done.stdout.strip()))
    return statistics.median(times)


def one_start(tree: Path, scratch: Path, cache_home: Path) -> dict:
    port = free_port()
    workdir = Path(tempfile.mkdtemp(dir=scratch))
    env = {**os.environ, "PYTHONPATH": str(tree), "TMPDIR": str(workdir),
           "XDG_CACHE_HOME": str(cache_home), "VLLM_SRUN_RESULT_CACHE": "0",
           "SR_LOG_FORMAT": "json"}  # fmt: skip
    argv = [sys.executable, "-m", "sr", "serve", "--config", str(workdir / "config.yaml"),
            "--port", str(port), "--threads", "1"]  # fmt: skip
    log_path = workdir / "stderr.log"
    launched = time.time()  # the log's clock: its events carry wall-clock `ts`
    started = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, cwd=workdir, env=env, stdout=subprocess.DEVNULL,
                                stderr=log)  # fmt: skip
    listening = first_200 = None
    try:
        while time.perf_counter() - started < _TIMEOUT_S:
            if proc.poll() is not None:
                raise SystemExit(f"sr serve exited with {proc.returncode}")
            if listening is None and _status(port, b"GET", b"/health") is not None:
                listening = time.perf_counter() - started
            if listening is not None and _status(port, b"POST", b"/v1/embeddings", _BODY) == 200:
                first_200 = time.perf_counter() - started
                break
            time.sleep(_POLL_S)
        else:
            raise SystemExit(f"no 200 within {_TIMEOUT_S:.0f} s")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        stages = _stages(log_path, launched)
        shutil.rmtree(workdir, ignore_errors=True)
    return {"listening_s": round(listening, 3), "first_200_s": round(first_200, 3), **stages}


def _stages(log_path: Path, launched: float) -> dict:
    """Seconds from launch to a start's milestones, from its JSON log: the model's fork
    server ready (model loaded), the worker warming (golden check, batching probe,
    calibration) and done warming. None for a milestone the log lacks (a tree without
    the event, or a spawned worker)."""
    first: dict[str, float] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or not isinstance(record.get("ts"), int | float):
            continue
        event = record.get("event")
        if event == "worker_state":
            event = f"worker_{record.get('state')}"
        first.setdefault(str(event), record["ts"] - launched)
    model_ready, warming = first.get("model_server_ready"), first.get("worker_warming")
    warmed = first.get("worker_batching")
    return {
        "model_server_ready_s": None if model_ready is None else round(model_ready, 3),
        "warm_up_s": None if warming is None or warmed is None else round(warmed - warming, 3),
    }


def _median(values) -> float | None:
    """The median of the values that are not None, or None."""
    present = [value for value in values if value is not None]
    return round(statistics.median(present), 3) if present else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", help="a revision of this checkout to compare against")
    parser.add_argument("--runs", type=int, default=4,
                        help="starts per side: a first start, then runs - 1 later")  # fmt: skip
    parser.add_argument("--first-starts", type=int, default=1,
                        help="first starts per side, each on an empty cache")  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sr-cold-") as scratch_name:
        scratch = Path(scratch_name)
        trees = {"candidate": ROOT}
        if args.baseline:
            trees["baseline"] = export_tree(args.baseline, scratch)
        caches = {side: scratch / f"cache-{side}" for side in trees}
        runs_per_side = args.first_starts + args.runs - 1  # the later starts: runs - 1
        order = schedule(runs_per_side) if args.baseline else ["candidate"] * runs_per_side
        runs: dict[str, list[dict]] = {side: [] for side in trees}
        imports = {side: import_seconds(tree) for side, tree in trees.items()}
        for side in order:
            if len(runs[side]) < args.first_starts:  # a host's first start: nothing kept yet
                shutil.rmtree(caches[side], ignore_errors=True)
            run = one_start(trees[side], scratch, caches[side])
            runs[side].append(run)
            print(f"{side:9s} listening {run['listening_s']:.3f} s, "
                  f"first 200 {run['first_200_s']:.3f} s", flush=True)  # fmt: skip
    summary = {}
    for side, side_runs in runs.items():
        first, later = side_runs[: args.first_starts], side_runs[args.first_starts :] or side_runs
        summary[side] = {
            "import_router_s": round(imports[side], 3),
            "first_listening_s": round(statistics.median(r["listening_s"] for r in first), 3),
            "first_first_200_s": round(statistics.median(r["first_200_s"] for r in first), 3),
            "listening_s": round(statistics.median(r["listening_s"] for r in later), 3),
            "model_server_ready_s": _median(r["model_server_ready_s"] for r in later),
            "warm_up_s": _median(r["warm_up_s"] for r in later),
            "first_200_s": round(statistics.median(r["first_200_s"] for r in later), 3),
            "runs": side_runs,
        }
    header = ["side", "import sr.router.serve s", "listening s", "model loaded s",
              "worker warm-up s", "first 200 s, a host's first (median)",
              "first 200 s, later (median)"]  # fmt: skip
    rows = [[side, s["import_router_s"], s["listening_s"], s["model_server_ready_s"],
             s["warm_up_s"], s["first_first_200_s"], s["first_200_s"]]
            for side, s in summary.items()]  # fmt: skip
    result: dict = {"baseline": args.baseline, "sides": summary}
    if "baseline" in summary:
        candidate, baseline = summary["candidate"], summary["baseline"]
        ratio = candidate["first_200_s"] / baseline["first_200_s"]
        first_ratio = candidate["first_first_200_s"] / baseline["first_first_200_s"]
        result["first_200_ratio"] = round(ratio, 3)
        result["first_start_ratio"] = round(first_ratio, 3)
        rows.append(["ratio", "", "", "", "", f"{first_ratio:.3f}", f"{ratio:.3f}"])
    print_table(header, rows)
    write_result("cold_start", result)


if __name__ == "__main__":
    main()
