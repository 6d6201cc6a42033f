"""Where the embedded MiniLM's forward spends its time, by operator, in sr and in references.

    python -m bench.bench_profile [--threads 1 2] [--rows short medium] [--batches 1 32]
        [--runs 30] [--batch-runs 4] [--top 8] [--sides sr transformers onnxruntime]

For each case (torch threads x row length x batch size; short rows are ~10 tokens, medium
~120, batch rows of slightly different lengths as real requests have) the same token ids go
through each side:
  * sr: `EncoderModel.embed(ids)` (packed rows, pooled and normalised), its products on
    the kernel chosen for the host (sr.models.linear);
  * sr_blas: the same with every product on `F.linear` (`load_model(kernel="blas")`, the
    kernel before the choice existed; same bits as then);
  * transformers: `BertModel` (its default attention, rows padded to the longest) with
    sentence-transformers' mean pooling and normalisation (bench_families' Reference);
  * onnxruntime (when installed): the same weights exported with `torch.onnx` and run by
    ONNX Runtime at the same thread count (bench_onnx; its own per-node profiler).
Wall time per forward is the median of runs that alternate the sides (profiler off). Then
each side runs a few forwards under torch.profiler (CPU, record_shapes) or ORT's profiler:
the top operators by self CPU time with their share of all operators' self time, and the
same time in categories (GEMM, attention, layer norm, GELU, elementwise, copies and views,
embedding gather, other) that the candidate kernel changes of issue 16 map onto. ORT's
fused Attention node includes the query/key/value projection, which sr and transformers
count as GEMM: compare GEMM + attention across them. With 2 threads, self time is the
calling thread's time in the operator (its wall time). Minor page faults per forward are
counted too (fresh memory each forward touches; ORT reuses an arena).
Prints the tables; writes bench/results/profile.json.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench.harness import print_table, write_result

ROW_TOKENS = {"short": 10, "medium": 120}
SIDES = ("sr", "sr_blas", "transformers", "onnxruntime")

# Words the texts are cut from: plain English prose, as support and search traffic sends.
_PROSE = (
    "The billing team asked whether the router could answer a single short query in under "
    "a millisecond while a nightly job embeds millions of passages in large batches. Each "
    "worker owns one copy of the weights and one device thread, so the forward itself "
    "decides how many texts a core can serve per second. A customer writes that her order "
    "#4821 arrived late, the box was damaged, and the replacement charger does not fit the "
    "laptop she bought in March; she wants a refund or a working part before Friday. The "
    "quick brown fox jumps over the lazy dog near the river bank while the printer on the "
    "third floor prints the quarterly report for the meeting at half past nine. Search "
    "ranks passages by the cosine of their vectors, clustering groups near duplicates, and "
    "classification heads sort tickets into shipping, billing and technical questions."
)
_CORPUS = _PROSE.split()

# torch operators -> category: by substring for the kernels, by exact name (without
# `aten::`) for the small operators; the first rule that matches wins.
_TORCH_CATEGORIES: tuple[tuple[str, tuple[str, ...], frozenset[str]], ...] = (
    ("gemm", ("addmm", "aten::mm", "aten::linear", "aten::matmul", "mkldnn"), frozenset()),
    ("attention", ("scaled_dot_product", "bmm", "softmax"), frozenset()),
    ("layer_norm", ("layer_norm",), frozenset()),
    ("gelu", ("gelu",), frozenset()),
    ("embedding gather", ("embedding",), frozenset({"index", "index_select"})),
    (
        "copies and views",
        (),
        frozenset({
            "copy_", "cat", "clone", "contiguous", "pad", "constant_pad_nd", "slice", "view",
            "_unsafe_view", "reshape", "transpose", "unbind", "select", "as_strided", "empty",
            "empty_like", "empty_strided", "fill_", "zero_", "resize_", "expand", "t",
            "chunk", "split", "split_with_sizes", "narrow", "stack", "unsqueeze", "squeeze",
            "permute", "to", "_to_copy", "lift_fresh", "detach", "alias", "arange", "ones",
            "zeros", "new_zeros", "full", "flatten", "_reshape_alias", "expand_as", "item",
            "_local_scalar_dense", "index_put_", "set_",
        }),
    ),
    (
        "elementwise",
        (),
        frozenset({
            "add", "add_", "mul", "mul_", "div", "div_", "sum", "mean", "norm", "clamp",
            "clamp_min", "sqrt", "rsqrt", "tanh", "sub", "rsub", "where", "masked_fill",
            "masked_fill_", "eq", "ne", "max", "min", "pow", "linalg_vector_norm", "exp",
            "bitwise_not", "bitwise_and", "logical_not", "all", "any",
        }),
    ),
)  # fmt: skip
_ORT_CATEGORIES = {
    "gemm": {"MatMul", "FusedMatMul", "Gemm", "MatMulNBits"},
    "attention": {"Attention", "MultiHeadAttention", "Softmax"},
    "layer_norm": {"LayerNormalization", "SkipLayerNormalization", "EmbedLayerNormalization"},
    "gelu": {"BiasGelu", "Gelu", "FastGelu", "Erf"},
    "embedding gather": {"Gather", "GatherElements"},
    "elementwise": {"Add", "Mul", "Div", "Sub", "ReduceSum", "ReduceL2", "Clip", "Sqrt",
                    "Where", "Equal", "And", "Not", "IsNaN", "GreaterOrEqual"},
}  # fmt: skip
CATEGORIES = (*(name for name, _, _ in _TORCH_CATEGORIES), "other")


def torch_category(op: str) -> str:
    short = op.removeprefix("aten::")
    for name, needles, names in _TORCH_CATEGORIES:
        if short in names or any(needle in op for needle in needles):
            return name
    return "other"


def ort_category(op_type: str) -> str:
    for name, types in _ORT_CATEGORIES.items():
        if op_type in types:
            return name
    # Shape plumbing (Reshape, Transpose, Concat, Unsqueeze, Shape, Expand, Slice, Cast...).
    return "copies and views"


# -- inputs --------------------------------------------------------------------------------


def text_of_tokens(tokenizer, tokens: int, start: int, tag: str = "") -> str:
    """Corpus words from word `start` (wrapping), then `tag`, grown until the text is at
    least `tokens` token ids long with its special tokens."""
    picked: list[str] = []
    while True:
        picked.append(_CORPUS[(start + len(picked)) % len(_CORPUS)])
        text = " ".join(picked) + (f" {tag}" if tag else "")
        if len(tokenizer.encode(text).ids) >= tokens:
            return text


def case_texts(tokenizer, rows: str, count: int, serial: int | None = None) -> list[str]:
    """`count` texts of about ROW_TOKENS[rows] tokens, each from its own place in the
    corpus (a word boundary may add a token or two, so lengths differ slightly). With a
    `serial`, row i ends in the tag `#<serial + i>`: callers that pass a running count get
    texts never sent before, so no result cache answers them."""
    offset = serial or 0
    return [
        text_of_tokens(
            tokenizer, ROW_TOKENS[rows], 11 * i + offset, "" if serial is None else f"#{offset + i}"
        )
        for i in range(count)
    ]


# -- timing and profiling ------------------------------------------------------------------


def interleaved(sides: dict[str, Callable[[], object]], runs: int) -> dict[str, dict]:
    """Seconds and minor page faults of each run of every side; the order of the sides
    rotates run by run, so load from other processes on the host falls on all of them
    alike. Faults count fresh memory a forward touches (each a kernel entry and a zeroed
    page): ORT reuses an arena, torch's CPU allocator returns big blocks to the OS."""
    names = list(sides)
    out: dict[str, dict] = {name: {"seconds": [], "faults": 0} for name in names}
    for i in range(runs):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            faults = _minor_faults()
            started = time.perf_counter()
            sides[name]()
            out[name]["seconds"].append(time.perf_counter() - started)
            out[name]["faults"] += _minor_faults() - faults
    return out


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _summary(op_ms: dict[str, tuple[float, int]], category_of, forwards: int, top: int) -> dict:
    """op -> (total self ms, calls) over `forwards` forwards -> per-forward top ops and
    categories, each with its share of all operators' self time."""
    total = sum(ms for ms, _ in op_ms.values()) or float("nan")
    ranked = sorted(op_ms.items(), key=lambda kv: kv[1][0], reverse=True)
    categories = dict.fromkeys(CATEGORIES, 0.0)
    for op, (ms, _) in op_ms.items():
        categories[category_of(op)] += ms
    return {
        "self_ms_per_forward": round(total / forwards, 3),
        "top_ops": [
            {
                "op": op,
                "category": category_of(op),
                "ms_per_forward": round(ms / forwards, 3),
                "share": round(ms / total, 4),
                "calls_per_forward": round(calls / forwards, 1),
            }
            for op, (ms, calls) in ranked[:top]
        ],
        "categories": {
            name: {"ms_per_forward": round(ms / forwards, 3), "share": round(ms / total, 4)}
            for name, ms in categories.items()
        },
    }


def torch_profile(fn: Callable[[], object], forwards: int, top: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(forwards):
            fn()
    op_ms = {
        e.key: (e.self_cpu_time_total / 1e3, e.count)
        for e in prof.key_averages()
        if e.self_cpu_time_total > 0
    }
    result = _summary(op_ms, torch_category, forwards, top)
    # The heaviest (operator, input shapes) pairs: which GEMM shapes cost what.
    shaped = sorted(
        prof.key_averages(group_by_input_shape=True),
        key=lambda e: e.self_cpu_time_total,
        reverse=True,
    )
    total = sum(ms for ms, _ in op_ms.values())
    result["top_shapes"] = [
        {
            "op": e.key,
            "shapes": str(e.input_shapes),
            "ms_per_forward": round(e.self_cpu_time_total / 1e3 / forwards, 3),
            "share": round(e.self_cpu_time_total / 1e3 / total, 4),
            "calls_per_forward": round(e.count / forwards, 1),
        }
        for e in shaped[:top]
    ]
    return result


def ort_profile(embedder, batch: list[list[int]], forwards: int, top: int) -> dict:
    return _summary(embedder.profile(batch, forwards), ort_category, forwards, top)


# -- the run -------------------------------------------------------------------------------


def _load_sides(wanted: list[str], dtype: str = "float32"):
    from bench.bench_families import Reference
    from bench.family_models import FAMILIES, quiet_transformers
    from sr.models import EMBEDDED_DEFAULT, load_model, resolve_artifact

    folder = resolve_artifact(EMBEDDED_DEFAULT)
    model = load_model(folder, dtype=dtype)  # sr at `--dtype`; the references stay float32
    if "sr_blas" in wanted:
        model.blas = load_model(folder, dtype=dtype, kernel="blas")
    reference = None
    if "transformers" in wanted:
        quiet_transformers()
        # The embedded MiniLM is a BERT with mean pooling and normalisation.
        reference = Reference(folder, FAMILIES["bert"], "cpu", "float32")
    return folder, model, reference


def _ort_embedders(folder: Path, workdir: Path, threads: list[int]) -> dict:
    from bench.bench_onnx import OrtEmbedder, export_onnx

    # The fused graph: its nodes (Attention, SkipLayerNormalization, BiasGelu) name the
    # categories directly.
    fused = export_onnx(folder, workdir, ["fused"])["fused"]
    return {n: OrtEmbedder(fused.path, n, profile_dir=workdir) for n in threads}


def _sides_for(batch: list[list[int]], model, reference, embedder) -> tuple[dict, dict]:
    """(side -> one forward of `batch`, side -> profiler(forwards, top) -> summary)."""
    sides: dict[str, Callable[[], object]] = {"sr": lambda: model.embed(batch)}
    if getattr(model, "blas", None) is not None:
        sides["sr_blas"] = lambda: model.blas.embed(batch)
    if reference is not None:
        sides["transformers"] = lambda: reference.embed(batch)
    profilers = {
        name: lambda forwards, top, fn=fn: torch_profile(fn, forwards, top)
        for name, fn in sides.items()
    }
    if embedder is not None:
        sides["onnxruntime"] = lambda: embedder.embed_ids(batch)
        profilers["onnxruntime"] = lambda forwards, top: ort_profile(embedder, batch, forwards, top)
    return sides, profilers


def run_case(sides, profilers, batch: list[list[int]], runs: int, top: int) -> dict:
    for fn in sides.values():  # warm-up: first-call allocations, oneDNN primitive caches
        fn()
        fn()
    timed = interleaved(sides, runs)
    wall = {name: round(statistics.median(t["seconds"]) * 1e3, 3) for name, t in timed.items()}
    faults = {name: round(t["faults"] / runs) for name, t in timed.items()}
    forwards = max(2, runs // 4)
    profiles = {name: profile(forwards, top) for name, profile in profilers.items()}
    lengths = [len(row) for row in batch]
    return {
        "batch": len(batch),
        "tokens": sum(lengths),
        "lengths": lengths if len(lengths) > 1 else lengths[0],
        "runs": runs,
        "profiled_forwards": forwards,
        "wall_ms": wall,
        "minor_faults_per_forward": faults,
        "profiles": profiles,
    }


def _print_case(label: str, case: dict, top: int) -> None:
    print(
        f"\n== {label}: {case['tokens']} tokens, wall ms per forward {case['wall_ms']}, "
        f"minor page faults per forward {case['minor_faults_per_forward']}"
    )
    names = list(case["profiles"])
    print_table(
        ("category", *(f"{n} ms" for n in names), *(f"{n} %" for n in names)),
        [
            (
                category,
                *(case["profiles"][n]["categories"][category]["ms_per_forward"] for n in names),
                *(
                    f"{100 * case['profiles'][n]['categories'][category]['share']:.1f}"
                    for n in names
                ),
            )
            for category in CATEGORIES
        ],
    )
    for name in names:
        p = case["profiles"][name]
        print(f"-- {name}: top {top} by self CPU ({p['self_ms_per_forward']} ms/forward)")
        print_table(
            ("op", "category", "ms/forward", "share %", "calls/forward"),
            [
                (o["op"], o["category"], o["ms_per_forward"], f"{100 * o['share']:.1f}",
                 o["calls_per_forward"])
                for o in p["top_ops"]
            ],
        )  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rows", nargs="+", choices=list(ROW_TOKENS), default=list(ROW_TOKENS))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--runs", type=int, default=30, help="timed runs of batch-1 cases")
    parser.add_argument("--batch-runs", type=int, default=4, help="timed runs of larger batches")
    parser.add_argument("--top", type=int, default=8, help="operators listed per side")
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16"), default="float32", help="sr's precision"
    )
    parser.add_argument("--out", default="profile", help="bench/results/<OUT>.json")
    args = parser.parse_args(argv)
    if "sr" not in args.sides:
        parser.error("--sides must include sr")

    started = time.perf_counter()
    folder, model, reference = _load_sides(args.sides, args.dtype)
    with tempfile.TemporaryDirectory(prefix="sr-bench-profile-") as tmp:
        ort = {}
        if "onnxruntime" in args.sides:
            try:
                ort = _ort_embedders(folder, Path(tmp), args.threads)
            except ImportError as exc:
                print(f"onnxruntime side skipped: {exc} (pip install '.[bench]')")
        cases = []
        for threads in args.threads:
            torch.set_num_threads(threads)
            model.calibrate_threads()
            if getattr(model, "blas", None) is not None:
                model.blas.calibrate_threads()
            for rows in args.rows:
                for size in args.batches:
                    texts = case_texts(model.tokenizer, rows, size)
                    batch = model.tokenize(texts)
                    sides, profilers = _sides_for(batch, model, reference, ort.get(threads))
                    runs = args.runs if size == 1 else args.batch_runs
                    case = run_case(sides, profilers, batch, runs, args.top)
                    case |= {"threads": threads, "rows": rows}
                    _print_case(f"{threads} thread(s), {rows} x {size}", case, args.top)
                    cases.append(case)

    print(
        "\nwall ms per forward (median, sides alternating); ratio = sr / other; "
        "faults = minor page faults per forward"
    )
    others = [s for s in SIDES[1:] if any(s in c["wall_ms"] for c in cases)]
    sides_seen = ["sr", *others]
    print_table(
        ("threads", "rows", "batch", "tokens", "sr", *others, *(f"sr/{o}" for o in others),
         *(f"faults {s}" for s in sides_seen)),
        [
            (
                c["threads"], c["rows"], c["batch"], c["tokens"], c["wall_ms"]["sr"],
                *(c["wall_ms"].get(o, "-") for o in others),
                *(
                    f"{c['wall_ms']['sr'] / c['wall_ms'][o]:.2f}" if o in c["wall_ms"] else "-"
                    for o in others
                ),
                *(c["minor_faults_per_forward"].get(s, "-") for s in sides_seen),
            )
            for c in cases
        ],
    )  # fmt: skip
    result = {
        "benchmark": "forward profile by operator, embedded MiniLM",
        "torch": torch.__version__,
        "dtype": args.dtype,
        "sides": list(cases[0]["wall_ms"]) if cases else [],
        "categories": list(CATEGORIES),
        "wall_s": round(time.perf_counter() - started, 1),
        "cases": cases,
    }
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
