"""Thread-count benchmark: fixed 1 thread, fixed 2 threads and adaptive learning, one run.

    python -m bench.bench_threads [--rounds N] [--min-samples K]

A mixed workload of short and long inputs (single rows and batches of 4) runs on the
embedded MiniLM through `ForwardRunner`, exactly as the worker engine drives it. The three
setups run in alternating rounds so that noise from other processes on the host hits all
of them alike. Prints a table of median served latency per input-size bucket and the table
the learning runner reached, and writes bench/results/threads.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from sr.models import EMBEDDED_DEFAULT, load_model, resolve_artifact
from sr.worker.adaptive import LearningSettings, bucket_label, size_bucket
from sr.worker.threads import ForwardRunner, bit_identical

RESULTS = Path(__file__).resolve().parent / "results" / "threads.json"

SHORT = ["hello there", "is this spam?", "route me to billing", "thanks a lot"]
LONG = [
    (
        "The quarterly report shows revenue growth in every region, with the largest gains in "
        "the cloud segment, while operating costs rose more slowly than expected. "
    )
    * 3,
    (
        "When several CPU models are busy at the same time, fewer threads per worker can reduce "
        "contention, while longer inputs on dedicated cores may prefer more threads. "
    )
    * 3,
]


def workload(model) -> list[tuple[str, list[list[int]]]]:
    """(name, token rows) batches: short and long, alone and in fours, interleaved."""
    short, long_ = model.tokenize(SHORT), model.tokenize(LONG)
    batches = [
        ("short x1", short[:1]),
        ("long x1", long_[:1]),
        ("short x4", short),
        ("long x4", long_ + long_),
    ]
    return batches * 3


def padded_tokens(rows: list[list[int]]) -> int:
    return len(rows) * max(len(row) for row in rows)


def run_round(runner, model, batches, latencies, answers) -> None:
    for name, rows in batches:
        start = time.perf_counter()
        out = runner.run(lambda rows=rows: model.embed(rows), padded_tokens(rows))
        latencies.setdefault(size_bucket(padded_tokens(rows)), []).append(
            (time.perf_counter() - start) * 1000.0
        )
        answers.append((name, out))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--min-samples", type=int, default=5)
    args = parser.parse_args(argv)

    model = load_model(resolve_artifact(EMBEDDED_DEFAULT))
    batches = workload(model)
    budget = len(os.sched_getaffinity(0))
    settings = LearningSettings(min_samples=args.min_samples)
    runners = {
        "fixed 1": ForwardRunner(1),
        "fixed 2": ForwardRunner(2),
        "learning (mode 1, configured 1)": ForwardRunner(
            1, mode=1, budget=budget, settings=settings
        ),
    }
    for runner in runners.values():
        runner.unlock()
    load_before = os.getloadavg()[0]
    latencies: dict[str, dict[int, list[float]]] = {name: {} for name in runners}
    answers: dict[str, list] = {name: [] for name in runners}
    for _ in range(args.rounds):
        for name, runner in runners.items():
            run_round(runner, model, batches, latencies[name], answers[name])

    load_after = os.getloadavg()[0]
    learned = runners["learning (mode 1, configured 1)"].report()
    served_same = all(
        bit_identical(a, b)
        for (_, a), (_, b) in zip(
            answers["fixed 1"], answers["learning (mode 1, configured 1)"], strict=True
        )
    )
    cross_count_same = all(
        bit_identical(a, b)
        for (_, a), (_, b) in zip(answers["fixed 1"], answers["fixed 2"], strict=True)
    )
    buckets = sorted(next(iter(latencies.values())))
    medians = {
        name: {str(b): round(statistics.median(per[b]), 3) for b in buckets}
        for name, per in latencies.items()
    }

    print(f"host: {platform.machine()}, {budget} CPUs in affinity, torch {torch.__version__}")
    print(
        f"workload: {len(batches)} batches x {args.rounds} rounds per setup; "
        f"1-min load average {load_before:.2f} before, {load_after:.2f} after\n"
    )
    header = f"{'bucket (padded tokens)':<24}" + "".join(f"{n:>34}" for n in runners)
    print("median served latency, ms")
    print(header)
    for b in buckets:
        cells = "".join(f"{medians[n][str(b)]:>34.2f}" for n in runners)
        print(f"{bucket_label(b):<24}{cells}")
    print(
        f"\nlearning: status={learned['status']} shadows={learned['shadows']}"
        f" suggested_threads={learned['suggested_threads']}"
    )
    if learned["reason"]:
        print(f"  reason: {learned['reason']}")
    print(f"{'bucket':<12}{'learned':>8}  median_ms by count (samples)")
    for row in learned["table"].values():
        cells = ", ".join(
            f"{c}: {ms:.2f} ({row['samples'][c]})" for c, ms in row["median_ms"].items()
        )
        print(f"{row['tokens']:<12}{row['learned']!s:>8}  {cells}")
    print(f"\nserved answers with learning on == fixed 1, bit for bit: {served_same}")
    print(f"fixed 1 == fixed 2 on every batch, bit for bit: {cross_count_same}")

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "host": {"machine": platform.machine(), "cpus": budget, "torch": torch.__version__},
                "model": EMBEDDED_DEFAULT,
                "rounds": args.rounds,
                "load_average_1m": {"before": load_before, "after": load_after},
                "batches_per_round": len(batches),
                "median_served_ms": medians,
                "learning_report": learned,
                "served_same_as_fixed_1": served_same,
                "fixed_1_equals_fixed_2": cross_count_same,
            },
            indent=2,
        )
    )
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
