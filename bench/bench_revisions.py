"""One benchmark, run on this checkout and on a baseline revision, alternating, side by side.

    python -m bench.bench_revisions --baseline REV [--runs 3] [--baseline-tree DIR] \\
        [--candidate REV] -- bench.bench_router --rounds 1 --seconds 2 --concurrency 1 8

Why: a change to the server must be measured against the commit before it under the same
host noise. The benchmarks compare two setups inside one run, but not two source trees, so
this runs the whole benchmark module once per side, in turn: the candidate is this checkout
(or, with --candidate, a committed revision: uncommitted edits made meanwhile cannot leak
in), the baseline is REV exported with `git archive` (or a tree given by --baseline-tree). Each
side runs with its tree as the working directory, so `python -m bench...` imports that
tree's `bench` and `sr`, and bench/harness.py (`_pythonpath`) and sr's pool (`worker_env`)
put the same tree first on the PYTHONPATH of the router and workers they start.

Order: pairs candidate-then-baseline and baseline-then-candidate alternate (C B B C C B ...),
because an A/A run showed the second of two back-to-back runs ~7 % cheaper by position
alone. Each run's bench/results/<name>.json is taken out of its tree (the tree's own copy
is left as it was) and its key numbers are tabled per side: medians, ranges, the ratio
candidate/baseline (above 1: the candidate costs more) and the per-pair ratios.

Provenance: a `sitecustomize` on every process's PYTHONPATH logs, 3 s after start, which
file `sr` was imported from; a run whose processes did not all import their own tree's sr
stops the comparison. Writes bench/results/revisions_<name>.json in this checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import ROOT, host_info, print_table

_PROBE = """\
import json, os, sys, threading, time
def _log():
    time.sleep(3)
    sr = sys.modules.get("sr")
    line = {"pid": os.getpid(), "argv": sys.argv[:3], "cwd": os.getcwd(),
            "pythonpath": os.environ.get("PYTHONPATH"), "sr": getattr(sr, "__file__", None)}
    with open(os.environ["SR_REVISIONS_PROBE_LOG"], "a") as log:
        log.write(json.dumps(line) + "\\n")
threading.Thread(target=_log, daemon=True).start()
"""


def export_tree(revision: str, into: Path) -> Path:
    """`git archive REV` of this checkout, unpacked under `into`."""
    tree = into / revision.replace("/", "_")
    tree.mkdir()
    archive = subprocess.Popen(["git", "archive", revision], cwd=ROOT, stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(tree)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise SystemExit(f"git archive {revision} failed")
    return tree


def result_name(module: str) -> str:
    """bench.bench_router -> router: the name its write_result() uses."""
    return module.removeprefix("bench.").removeprefix("bench_")


def schedule(runs: int) -> list[str]:
    """candidate, baseline, baseline, candidate, candidate, baseline, ..."""
    order: list[str] = []
    for i in range(runs):
        pair = ("candidate", "baseline")
        order += pair if i % 2 == 0 else pair[::-1]
    return order


def run_once(tree: Path, command: list[str], name: str, probe: Path) -> tuple[dict, list]:
    """Run the benchmark in `tree`; its result and the probe's lines for this run. The
    tree's own result file is put back as it was."""
    out = tree / "bench" / "results" / f"{name}.json"
    before = out.read_bytes() if out.exists() else None
    log = probe / f"log-{time.time_ns()}"
    paths = [str(probe), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "SR_REVISIONS_PROBE_LOG": str(log)}
    started = time.time()
    subprocess.run(command, cwd=tree, env=env, check=True)
    if not out.exists() or out.stat().st_mtime < started:
        raise SystemExit(f"{out} was not written by this run")
    result = json.loads(out.read_text())
    if before is None:
        out.unlink()
    else:
        out.write_bytes(before)
    lines = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return result, lines


def check_provenance(tree: Path, lines: list[dict]) -> str:
    """Every logged process that imported sr must have it from `tree`."""
    loaded = [line for line in lines if line["sr"]]
    wrong = [line for line in loaded if not Path(line["sr"]).is_relative_to(tree)]
    if wrong or not loaded:
        raise SystemExit(f"sr not from {tree}: {wrong or 'no process logged sr'}")
    kinds = sorted({" ".join(Path(a).name for a in line["argv"][:2]) for line in loaded})
    return f"sr from {tree} in {len(loaded)} processes ({'; '.join(kinds)})"


def key_numbers(name: str, result: dict) -> dict[str, float]:
    """The numbers compared per benchmark (lower is better for all of them)."""
    numbers = {}
    if name == "router":
        for row in result["rows"]:
            c = row["concurrency"]
            numbers[f"c{c} overhead p50 ms"] = row["p50_overhead_ms"]
            numbers[f"c{c} overhead p99 ms"] = row["p99_overhead_ms"]
            numbers[f"c{c} router CPU us/req"] = row["router_cpu_us_per_request"]
            numbers[f"c{c} direct (worker) p50 ms"] = row["direct"]["p50_ms"]
    elif name == "worker_server":
        for row in sorted(result["rows"], key=lambda r: r["server"] != "h1"):
            cell = f"{row['endpoint']} c{row['concurrency']}"
            if row["server"] == "h1":
                numbers[f"h1 {cell} worker CPU us/req"] = row["worker_cpu_us_per_request"]
                numbers[f"h1 {cell} p50 ms"] = row["p50_ms"]
            else:  # a control: the hypercorn copy barely changes between the trees
                numbers[f"{row['server']} {cell} worker CPU us/req"] = row[
                    "worker_cpu_us_per_request"
                ]
    elif name == "profile":  # bench_profile: each side's wall time per forward
        for case in result["cases"]:
            cell = f"{case['threads']}t {case['rows']} x{case['batch']}"
            for side, ms in case["wall_ms"].items():
                numbers[f"{cell} {side} wall ms"] = ms
    elif name == "stages":  # bench_stages: one request's stages, medians
        numbers = {f"{stage}, ms": ms for stage, ms in result["stages_ms"].items()}
    else:
        raise SystemExit(f"no key numbers defined for {name!r}")
    return numbers


def compare(runs: list[dict]) -> list[dict]:
    """Per metric: both sides' values in run order, medians, ratio, per-pair ratios."""
    sides = {s: [r["numbers"] for r in runs if r["side"] == s] for s in ("baseline", "candidate")}
    rows = []
    for metric in sides["baseline"][0]:
        base = [n[metric] for n in sides["baseline"]]
        cand = [n[metric] for n in sides["candidate"]]
        pairs = [c / b for c, b in zip(cand, base, strict=True) if b]
        rows.append(
            {
                "metric": metric,
                "baseline": base,
                "candidate": cand,
                "baseline_median": statistics.median(base),
                "candidate_median": statistics.median(cand),
                "ratio": statistics.median(cand) / statistics.median(base),
                "pair_ratios": [round(p, 3) for p in pairs],
            }
        )
    return rows


def print_comparison(rows: list[dict]) -> None:
    def spread(values: list[float]) -> str:
        return f"{min(values):g}-{max(values):g}"

    print_table(
        ("metric", "base median", "base range", "cand median", "cand range", "ratio",
         "pair ratios", "cand worse"),
        [
            (r["metric"], r["baseline_median"], spread(r["baseline"]), r["candidate_median"],
             spread(r["candidate"]), f"{r['ratio']:.3f}",
             " ".join(f"{p:.2f}" for p in r["pair_ratios"]),
             f"{sum(p > 1 for p in r['pair_ratios'])}/{len(r['pair_ratios'])}")
            for r in rows
        ],
    )  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        raise SystemExit("usage: python -m bench.bench_revisions --baseline REV -- MODULE ARGS")
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="git revision to compare against")
    parser.add_argument("--baseline-tree", type=Path, help="REV already exported here")
    parser.add_argument("--runs", type=int, default=3, help="runs per side")
    parser.add_argument("--candidate", help="a revision to export (default: this checkout)")
    args = parser.parse_args(argv[:split])
    module, *bench_args = argv[split + 1 :]
    name = result_name(module)
    command = [sys.executable, "-m", module, *bench_args]
    runs = []
    with tempfile.TemporaryDirectory(prefix="sr-revisions-") as tmp:
        probe = Path(tmp) / "probe"
        probe.mkdir()
        (probe / "sitecustomize.py").write_text(_PROBE)
        trees = {
            "candidate": export_tree(args.candidate, Path(tmp)) if args.candidate else ROOT,
            "baseline": (args.baseline_tree or export_tree(args.baseline, Path(tmp))).resolve(),
        }
        for i, side in enumerate(schedule(args.runs)):
            print(f"\n== run {i + 1}: {side} ({trees[side]}): {' '.join(command[1:])}", flush=True)
            started = time.monotonic()
            result, lines = run_once(trees[side], command, name, probe)
            provenance = check_provenance(trees[side], lines)
            took = time.monotonic() - started
            print(f"== run {i + 1}: {side}, {took:.0f} s; {provenance}", flush=True)
            numbers = key_numbers(name, result)
            runs.append(
                {"side": side, "position": i % 2, "seconds": round(took, 1),
                 "load_average_1m": result.get("host", {}).get("load_average_1m"),
                 "provenance": provenance, "processes": lines, "numbers": numbers,
                 "result": result}
            )  # fmt: skip
    rows = compare(runs)
    candidate = args.candidate or str(ROOT)
    print(f"\n{name}: candidate {candidate} vs baseline {args.baseline}, {args.runs} runs per side")
    print_comparison(rows)
    summary = {
        "benchmark": "revisions",
        "module": module,
        "arguments": bench_args,
        "candidate": candidate,
        "baseline": args.baseline,
        "runs_per_side": args.runs,
        "comparison": rows,
        "runs": runs,
        "host": host_info(),
    }
    out = ROOT / "bench" / "results" / f"revisions_{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return summary


if __name__ == "__main__":
    main()
