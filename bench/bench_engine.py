"""sr's encoder against sentence-transformers on the embedded MiniLM, one thread each.

    python -m bench.bench_engine [--single-runs 200] [--batch-runs 50]

(a) max abs diff of the embeddings of 200 varied texts (must be <= 1e-5);
(b) one short input, in process: sr `embed(tokenize([t]))` vs `st.encode(t)`, median;
(c) 32 short inputs: sr `embed(tokenize(batch))` vs `st.encode(batch, batch_size=32)`.
Timings alternate between the two implementations call by call so that load from other
processes on the host hits both alike. Prints a table; writes bench/results/engine.json.
Needs sentence-transformers (pip install '.[bench]').
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from pathlib import Path

import torch

from sr.models import EMBEDDED_DEFAULT, load_model, resolve_artifact

RESULTS = Path(__file__).parent / "results" / "engine.json"
TOLERANCE = 1e-5
SINGLE_TARGET_RATIO = 0.7

_WORDS = [
    "router",
    "model",
    "replica",
    "worker",
    "batch",
    "token",
    "cache",
    "deadline",
    "health",
    "probe",
    "the",
    "a",
    "of",
    "and",
    "to",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "encoder",
    "embedding",
    "classify",
    "decision",
    "latency",
]
_UNICODE = ["café", "naïve", "Straße", "東京", "日本語", "Москва", "مرحبا", "🙂", "🚀", "Ångström"]
_PUNCT = ["!", "?", "...", ",", ";", "--", "(", ")", "§4.2", "#", "@", "'s", '"']
SHORT_INPUTS = [
    "What is the capital of France?",
    "hello world",
    "route this to billing",
    "is the model healthy",
    "Crème brûlée recipe",
    "cancel my order #1234",
    "東京の天気は？",
    "best GPU for inference",
]


def varied_texts(count: int = 200, seed: int = 0) -> list[str]:
    """Deterministic mix: empty, short, long (past 256 tokens), punctuation, unicode, code."""
    rng = random.Random(seed)
    texts = ["", "   "]
    while len(texts) < count:
        kind = len(texts) % 5
        if kind == 0:
            n = rng.randint(1, 4)
        elif kind == 1:
            n = rng.randint(8, 30)
        elif kind == 2:
            n = rng.randint(150, 400)
        else:
            n = rng.randint(5, 60)
        words = []
        for _ in range(n):
            roll = rng.random()
            if (kind == 3 and roll < 0.3) or roll < 0.05:
                words.append(rng.choice(_UNICODE))
            elif (kind == 4 and roll < 0.3) or roll < 0.08:
                words.append(rng.choice(_PUNCT))
            elif roll < 0.1:
                words.append(str(rng.randint(0, 10**6)))
            else:
                words.append(rng.choice(_WORDS).capitalize() if roll > 0.9 else rng.choice(_WORDS))
        texts.append(" ".join(words))
    return texts


def _alternating_medians(ours, theirs, runs: int) -> tuple[float, float]:
    ours_s, theirs_s = [], []
    for i in range(runs):
        for fn, into in ((ours, ours_s), (theirs, theirs_s))[:: 1 if i % 2 else -1]:
            started = time.perf_counter()
            fn(i)
            into.append(time.perf_counter() - started)
    return statistics.median(ours_s) * 1e3, statistics.median(theirs_s) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--single-runs", type=int, default=200)
    parser.add_argument("--batch-runs", type=int, default=50)
    args = parser.parse_args(argv)

    import sentence_transformers

    torch.set_num_threads(1)
    folder = resolve_artifact(EMBEDDED_DEFAULT)
    st = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    model = load_model(folder)
    limit = st.max_seq_length

    texts = varied_texts()
    reference = torch.from_numpy(st.encode(texts, batch_size=32, convert_to_numpy=True))
    ids = [model.truncate(row, limit) for row in model.tokenize(texts)]
    ours = torch.cat([model.embed(ids[i : i + 32]) for i in range(0, len(ids), 32)])
    max_diff = float((ours - reference).abs().max())

    def sr_single(i):
        model.embed(model.tokenize([SHORT_INPUTS[i % len(SHORT_INPUTS)]]))

    def st_single(i):
        st.encode(SHORT_INPUTS[i % len(SHORT_INPUTS)])

    batch = [f"{SHORT_INPUTS[i % len(SHORT_INPUTS)]} ({i})" for i in range(32)]

    def sr_batch(_):
        model.embed([model.truncate(row, limit) for row in model.tokenize(batch)])

    def st_batch(_):
        st.encode(batch, batch_size=32)

    _alternating_medians(sr_single, st_single, 20)  # warm-up
    single = _alternating_medians(sr_single, st_single, args.single_runs)
    _alternating_medians(sr_batch, st_batch, 3)
    batched = _alternating_medians(sr_batch, st_batch, args.batch_runs)

    rows = [
        (
            "(a) max abs diff, 200 texts",
            f"{max_diff:.2e}",
            "-",
            f"<= {TOLERANCE:g}",
            "pass" if max_diff <= TOLERANCE else "FAIL",
        ),
        (
            "(b) single short input, ms",
            f"{single[0]:.3f}",
            f"{single[1]:.3f}",
            f"ratio {single[0] / single[1]:.3f} (target <= {SINGLE_TARGET_RATIO})",
            "pass" if single[0] / single[1] <= SINGLE_TARGET_RATIO else "miss",
        ),
        (
            "(c) batch of 32 short, ms",
            f"{batched[0]:.3f}",
            f"{batched[1]:.3f}",
            f"ratio {batched[0] / batched[1]:.3f}",
            "-",
        ),
    ]
    header = ("measure", "sr", "sentence-transformers", "comparison", "verdict")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)))

    result = {
        "threads": 1,
        "texts": len(texts),
        "max_abs_diff": max_diff,
        "tolerance": TOLERANCE,
        "single_ms": {
            "sr": single[0],
            "sentence_transformers": single[1],
            "ratio": single[0] / single[1],
            "runs": args.single_runs,
        },
        "batch32_ms": {
            "sr": batched[0],
            "sentence_transformers": batched[1],
            "ratio": batched[0] / batched[1],
            "runs": args.batch_runs,
        },
        "host": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "sentence_transformers": sentence_transformers.__version__,
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
        },
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0 if max_diff <= TOLERANCE else 1


if __name__ == "__main__":
    raise SystemExit(main())
