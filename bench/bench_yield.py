"""Yielding cores (sr.worker.contention) against libgomp's spin count alone: a worker's forward
runner configured at 2 threads, on a quiet host and beside a process holding one core.

    python -m bench.bench_yield [--rounds 2] [--forwards 15]

Sides, each in a process of its own (libgomp reads GOMP_SPINCOUNT once, at load):
* `spin1000`: 1000 spins, no yielding (what workers ran before);
* `spin20000`: 20000 spins, no yielding (the spin count alone);
* `yield`: 20000 spins (sr.pool.fork_start.WORKER_SPIN_COUNT) and the runner allowed to yield
  as WorkerService allows it (the start-up probe, then the policy on /proc/stat);
* `placed`: as `yield`, and the OpenMP peers kept off the device thread's CPU
  (sr.worker.placement), as WorkerService places them: what a worker runs now.
Loads: `quiet`, and `loaded`: a child process busy-looping in Python for the side's run
(killed after it; the host has 2 cores, so it holds one).
Cases: one medium and one short text (bench_profile's), each after an idle pause of 0.1 s
and back to back; the embedded MiniLM; median ms of `--forwards` forwards. Sides alternate
their order round by round. Prints a table; writes bench/results/yield.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from bench.harness import print_table, write_result

# side: (GOMP_SPINCOUNT, yielding, peer placement)
SIDES = {
    "spin1000": (1000, False, False),
    "spin20000": (20000, False, False),
    "yield": (20000, True, False),
    "placed": (20000, True, True),
}
IDLE_PAUSE_S = 0.1


def child(spec: dict) -> None:
    """One side: load MiniLM at 2 threads, run every case, print one JSON line."""

    from bench.bench_profile import case_texts
    from bench.harness import embedded_artifact
    from sr.models import load_model, resolve_artifact
    from sr.worker.placement import placement_for
    from sr.worker.threads import ForwardRunner
    from sr.worker.warmup import core_yield_for

    model = load_model(resolve_artifact(embedded_artifact(), None))
    runner = ForwardRunner(2)
    runner.at_each_count(model.calibrate_threads)
    detail = "not yielding"
    if spec["yield"]:  # as WorkerService sets it up
        core_yield, detail = core_yield_for(model, 2, 256)
        if core_yield is not None:
            runner.allow_yielding(core_yield)
    if spec["place"]:  # as WorkerService places them
        placement, _ = placement_for(2)
        if placement is not None:
            runner.place_peers(placement)
    rows = {
        name: model.tokenize(case_texts(model.tokenizer, name, 1)) for name in ("medium", "short")
    }
    for _ in range(3):
        runner.run(lambda: model.embed(rows["medium"]), 0)
    result: dict = {"probe": detail}
    for name, batch in rows.items():
        for label, pause in (("idle", IDLE_PAUSE_S), ("b2b", 0.0)):
            times = []
            for _ in range(spec["forwards"]):
                time.sleep(pause)
                start = time.perf_counter()
                runner.run(lambda batch=batch: model.embed(batch), len(batch[0]))
                times.append((time.perf_counter() - start) * 1e3)
            result[f"{name} {label}"] = statistics.median(times)
    result["yielded"] = runner.yielding.yielded if runner.yielding else 0
    print(json.dumps(result), flush=True)


def run_side(side: str, forwards: int) -> dict:
    spin, yielding, place = SIDES[side]
    env = {**os.environ, "GOMP_SPINCOUNT": str(spin)}
    env.pop("OMP_NUM_THREADS", None)
    spec = json.dumps({"yield": yielding, "place": place, "forwards": forwards})
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_yield", "--child", spec],
        env=env, capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--forwards", type=int, default=15)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    samples: dict[tuple[str, str], list[dict]] = {}
    order = list(SIDES)
    for round_ in range(args.rounds):
        for load in ("quiet", "loaded"):
            for side in order if round_ % 2 == 0 else order[::-1]:
                hog = None
                if load == "loaded":
                    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                try:
                    samples.setdefault((load, side), []).append(run_side(side, args.forwards))
                finally:
                    if hog is not None:
                        hog.kill()
                        hog.wait()
    cases = ["medium idle", "medium b2b", "short idle", "short b2b"]
    table = []
    for (load, side), runs in samples.items():
        row = {"load": load, "side": side}
        for case in cases:
            row[f"{case} ms"] = round(statistics.median(r[case] for r in runs), 2)
        row["yielded forwards"] = sum(r["yielded"] for r in runs)
        table.append(row)
    print_table(list(table[0]), [list(row.values()) for row in table])
    probe = next((r["probe"] for (_, side), runs in samples.items() for r in runs
                  if side == "yield"), None)  # fmt: skip
    print(f"yield side's start-up probe: {probe}")
    write_result("yield", {"rounds": args.rounds, "forwards": args.forwards, "rows": table,
                           "probe": probe})  # fmt: skip


if __name__ == "__main__":
    main()
