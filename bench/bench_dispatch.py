"""Dispatch choice cost: DeploymentPolicy.reserve over N ready replicas (pure, no I/O).

    python bench/bench_dispatch.py            # prints a table, writes bench/results/dispatch.json

Each sample times a block of reserve() calls (the choice plus the reservation), releasing
outside the timed block so that load stays spread as in a busy pool; the target is well
under 20 microseconds per choice at 64 replicas.
"""

from __future__ import annotations

import itertools
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # running from a checkout that is not installed
    sys.path.insert(0, str(ROOT))

from sr.pool.outcome import Outcome  # noqa: E402
from sr.pool.policy import DeploymentPolicy  # noqa: E402
from sr.pool.record import ReplicaRecord  # noqa: E402
from sr.pool.state import ReplicaState  # noqa: E402

BLOCK = 16  # reservations per timed block (16 x 64 replicas stays under the 32 cap)
SAMPLES = 2000


def make_pool(n: int, *, backoff_share: float = 0.0) -> DeploymentPolicy:
    seq = itertools.count(1)
    policy = DeploymentPolicy("bench", next_sequence=seq.__next__)
    records = [
        ReplicaRecord(replica_id=f"r{i}", deployment="bench", placement="cpu") for i in range(n)
    ]
    policy.publish(records, policy.outlier)
    for i, rec in enumerate(records):
        policy.set_lifecycle(rec, ReplicaState.READY, 0.0)
        if i < int(n * backoff_share):
            rec.backoff.bad_outcome(0.0)
            rec.backoff.until = 1e9  # stays out of dispatch for the whole run
            rec.recompute_blocked()
    return policy


def measure(n: int, *, backoff_share: float = 0.0, nbytes: int = 2048) -> dict:
    policy = make_pool(n, backoff_share=backoff_share)
    perf = time.perf_counter_ns
    per_call = []
    for sample in range(SAMPLES):
        now = float(sample)
        held = []
        t0 = perf()
        for _ in range(BLOCK):
            held.append(policy.reserve(nbytes, now))
        t1 = perf()
        for res in held:
            policy.release(res, Outcome.OK, now)
        per_call.append((t1 - t0) / BLOCK / 1000)  # microseconds
    per_call.sort()
    return {
        "replicas": n,
        "in_backoff": int(n * backoff_share),
        "median_us": round(statistics.median(per_call), 3),
        "p99_us": round(per_call[int(len(per_call) * 0.99)], 3),
        "max_us": round(per_call[-1], 3),
    }


def main() -> None:
    cases = [measure(n) for n in (1, 4, 16, 64)] + [measure(64, backoff_share=0.5)]
    print(f"{'replicas':>8} {'backoff':>7} {'median us':>10} {'p99 us':>8} {'max us':>8}")
    for row in cases:
        print(
            f"{row['replicas']:>8} {row['in_backoff']:>7} {row['median_us']:>10.2f}"
            f" {row['p99_us']:>8.2f} {row['max_us']:>8.2f}"
        )
    out = ROOT / "bench" / "results" / "dispatch.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "dispatch choice + reservation (DeploymentPolicy.reserve)",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "block": BLOCK,
        "samples": SAMPLES,
        "cases": cases,
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
