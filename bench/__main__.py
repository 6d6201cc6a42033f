"""Run the benchmarks one after another and write bench/results/report.md with the plots.

    python -m bench                 # everything (about 4 minutes on the quiet 2-core host)
    python -m bench --quick         # shorter runs of every benchmark
    python -m bench --only router scaling
    python -m bench --only worker_server   # hypercorn vs sr's h11 server (needs the bench extra)
    python -m bench --only onnx     # sr vs ONNX Runtime at 1 and 2 threads (the bench extra)
    python -m bench --report-only   # rewrite bench/results/report.md from bench/results/*.json

Each benchmark runs in its own process (torch thread settings and imports stay apart),
prints its table and writes bench/results/<name>.json; the report reads those files.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from bench.harness import ROOT

# name -> (module, full arguments, quick arguments)
BENCHMARKS: dict[str, tuple[str, list[str], list[str]]] = {
    "dispatch": ("bench.bench_dispatch", [], []),
    "families": ("bench.bench_families", [], ["--runs", "15", "--batch-runs", "3"]),
    "frontend": ("bench.bench_frontend", ["--requests", "40000"], ["--requests", "10000"]),
    "transport": ("bench.bench_transport", ["--rounds", "20"], ["--rounds", "6"]),
    "router": (
        "bench.bench_router",
        ["--seconds", "2", "--rounds", "4"],
        ["--seconds", "1", "--rounds", "2"],
    ),
    "scaling": (
        "bench.bench_scaling",
        ["--seconds", "3", "--rounds", "2"],
        ["--seconds", "1.5", "--rounds", "1", "--concurrency", "1", "32", "64"],
    ),
    "serve_st": (
        "bench.bench_serve_st",
        ["--rounds", "20", "--singles", "100"],
        ["--rounds", "8", "--singles", "40"],
    ),
    "engine": ("bench.bench_engine", [], ["--single-runs", "60", "--batch-runs", "12"]),
    "onnx": ("bench.bench_onnx", [], ["--rounds", "3", "--singles", "15"]),
    "threads": ("bench.bench_threads", [], ["--rounds", "4"]),
    "worker_http": ("bench.bench_worker_http", [], ["--rounds", "8"]),
    "worker_server": ("bench.bench_worker_server", [], ["--rounds", "2", "--per-round", "150"]),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=sorted(BENCHMARKS),
        metavar="NAME",
        help=f"run only these benchmarks: {', '.join(BENCHMARKS)}",
    )
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite the report from bench/results"
    )
    parser.add_argument("--no-report", action="store_true", help="run without writing the report")
    args = parser.parse_args(argv)
    failed = []
    if not args.report_only:
        for name in args.only or BENCHMARKS:
            module, full, quick = BENCHMARKS[name]
            command = [sys.executable, "-m", module, *(quick if args.quick else full)]
            print(f"\n== {name}: {' '.join(command[1:])}", flush=True)
            started = time.monotonic()
            code = subprocess.call(command, cwd=ROOT)
            print(f"== {name}: exit {code} after {time.monotonic() - started:.0f} s", flush=True)
            if code != 0:
                failed.append(name)
    if not args.no_report:
        from bench.report import write_report

        path = write_report(quick=args.quick)
        print(f"\nwrote {path.relative_to(ROOT)}")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
