"""sr's engines against transformers, per model family, in process, at one thread.

    python -m bench.bench_families [--families bert mpnet ...] [--head embed|token]
        [--runs 40] [--batch-runs 5] [--layers N] [--device cpu|cuda:0]
        [--dtype float32|bfloat16|float16] [--reference transformers|sentence-transformers]
        [--no-ort] [--models-dir DIR] [--profile] [--out NAME]

For each family sr serves (bert, xlm-roberta, mpnet, distilbert, deberta-v2, modernbert,
qwen3, gemma3_text) a random model of a real checkpoint's widths and head counts, fewer layers
(bench/family_models.py), is written with transformers' `save_pretrained` and loaded
twice: by sr (`load_model`, then
`embed(ids)`: packed rows, no padding) and by transformers (`AutoModel`, eval,
inference_mode, its default attention implementation), whose forward on the same token ids
is followed by the pooling sentence-transformers applies (attention-masked mean for the
encoders and gemma3_text, the last token for qwen3; then gemma3_text's two Dense modules,
as EmbeddingGemma's, in float32 as sr applies them; then L2 normalisation). Cases:
  * short: one ~9-token text, latency (median ms);
  * long: one ~120-token text, latency (median ms);
  * batch32: 32 texts of 6 to ~128 tokens, throughput (texts/s): sr packs them into one
    call; transformers pads them to the longest in one batch (right padding; left for
    qwen3, as Qwen3-Embedding's tokenizer), as sentence-transformers' encode does.
The sides alternate run by run after a warm-up (the order rotating each run), so load from
other processes hits them alike. Targets: sr <= 1.0x the reference's latency on short and
long, >= 1.0x its throughput on batch32, read on the ratio of the medians; `paired` is the
median of the run-by-run ratios (steadier on a busy host). Each case also reports the max
abs diff between the two pooled outputs (the same math: under 1e-6 at float32).

A third side, `sr_ort`, is sr's onnxruntime engine on the same folder (`load_model(folder,
engine="onnxruntime")`: the family's backbone exported to ONNX, the graph kept under
SR_CACHE_DIR; pooling and heads in torch), timed in the same rotation on the same ids with
the same method; it runs at `--device cpu --dtype float32` only (skipped with a printed line
otherwise, or with `--no-ort`). Per case it reports its median, its ratio to sr's torch
engine (`ort/sr`, of the medians, and `ort paired`, of the run-by-run ratios: ms over ms on
short and long, lower is better for ORT; texts/s over texts/s on batch32, higher is
better), and the max abs diff between its output and sr torch's: at most 1e-5 for
embeddings (a larger one is marked MISSED and the run exits 1), reported only for token
logits. The engine card's `graph` (fused: ORT's transformer fusions kept; plain) is
recorded per family; a family whose export is refused (UnsupportedModel) has its sr_ort
recorded as refused with the message, and the other sides still run.

`--head token` benchmarks the token-classification heads instead, for the families whose sr
model serves one (bert, xlm-roberta, mpnet, distilbert, deberta-v2, modernbert): the folder
holds transformers' `AutoModelForTokenClassification` (9 labels), sr runs
`token_logits(ids)` (packed rows: one row of logits per token) and the reference is
`AutoModelForTokenClassification`'s forward `.logits` on the same ids (padded as above, with
the attention mask), its padding positions dropped; the max abs diff is over every real
token's logits. Same cases, timing and targets; writes bench/results/families-token.json.

`--reference sentence-transformers` times `SentenceTransformer.encode(texts)` instead
(tokenization included on both sides: sr then runs `embed(tokenize(texts))`). Without it,
when sentence-transformers is installed, its `encode` is still run once per family to
check that the reference pooling above is its math (`st_vs_reference` in the JSON).
`--profile` prints torch profiler tables (top ops by self CPU time) of both sides per case.
`--device cuda:0 --dtype bfloat16` is what bench/gpu_check.sh runs on a GPU host (a dtype
other than float32 needs `sr.models.load_model(..., dtype=...)`).
Prints a table; writes bench/results/families.json (families-token.json with --head token;
or --out NAME).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.family_models import (
    EMBED,
    FAMILIES,
    TOKEN,
    FamilySpec,
    cached_family,
    dense_weights,
    quiet_transformers,
    token_head_families,
)
from bench.harness import ROOT, print_table, write_result

LATENCY_TARGET = 1.0  # sr ms / reference ms, at most
THROUGHPUT_TARGET = 1.0  # sr texts/s / reference texts/s, at least
ORT_EMBED_TOLERANCE = 1e-5  # max abs diff, sr_ort's embeddings against sr torch's
BATCH = 32
LONG_TOKENS = 120
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Head:
    """What a run benchmarks: the transformers class the reference loads, and the method
    both sides (sr's EncoderModel and `Reference`) run on a batch of token ids."""

    name: str
    auto_class: str  # transformers.<auto_class>.from_pretrained(folder)
    method: str  # model.<method>(ids) and reference.<method>(ids)
    out: str  # default results file name


HEADS = {
    EMBED: Head(EMBED, "AutoModel", "embed", "families"),
    TOKEN: Head(TOKEN, "AutoModelForTokenClassification", "token_logits", "families-token"),
}

SHORT_TEXT = "What is the capital of France?"
# Prose to cut texts from (the long text and the batch's texts are runs of its words).
_CORPUS = (
    "A router serves small encoder models as pools of worker processes. Each replica loads "
    "its own copy of the weights, answers health probes, and batches the rows of concurrent "
    "requests into shared forward passes when that leaves every answer bit-identical. "
    "Requests arrive over HTTP; the router picks the ready worker with the fewest outstanding "
    "bytes, admits at most thirty-two requests per worker, backs off from workers that fail, "
    "ejects those that time out again and again, and restarts the ones that die. Embeddings "
    "feed search, clustering and deduplication; classification heads sort support tickets "
    "into billing, shipping or technical questions; decision prompts ask whether a message "
    "is urgent, polite, or in need of a human. The quick brown fox jumps over the lazy dog "
    "near the river bank while the printer on the third floor, which has jammed twice since "
    "Monday, prints the quarterly report (forty-two pages, double sided) for the meeting at "
    "half past nine. Crème brûlée, naïve café, Straße and déjà vu test the tokenizer's "
    "handling of accents; numbers such as 3.14159, 2024-06-01 and #1234 test its splitting "
    "of digits and punctuation. Latency matters for a single short query typed by a person; "
    "throughput matters when a nightly job embeds millions of passages in large batches."
)


# -- inputs --------------------------------------------------------------------------------


def _words_for(tokenizer, target: int, start: int) -> str:
    """A run of corpus words from word `start` (wrapping) of about `target` tokens."""
    words = _CORPUS.split()
    picked: list[str] = []
    while True:
        picked.append(words[(start + len(picked)) % len(words)])
        text = " ".join(picked)
        if len(tokenizer.encode(text).ids) >= target:
            return text


def make_texts(tokenizer) -> dict[str, list[str]]:
    """The cases' texts: short (1), long (1, ~120 tokens), batch32 (6 to ~128 tokens)."""
    rng = random.Random(0)
    # A mix as a search or support workload sends: a third short queries, a third
    # sentences, a third passages.
    targets = (
        [rng.randint(6, 20) for _ in range(11)]
        + [rng.randint(21, 64) for _ in range(11)]
        + [rng.randint(65, 128) for _ in range(10)]
    )
    rng.shuffle(targets)
    batch = [_words_for(tokenizer, t, rng.randrange(400)) for t in targets]
    return {
        "short": [SHORT_TEXT],
        "long": [_words_for(tokenizer, LONG_TOKENS, 0)],
        "batch32": batch,
    }


# -- the two implementations ----------------------------------------------------------------


def load_sr(folder: Path, device: str, dtype: str):
    """sr's model; a dtype other than float32 needs load_model's `dtype` parameter."""
    from sr.models import load_model

    if "dtype" not in inspect.signature(load_model).parameters:
        if dtype != "float32":
            raise SystemExit(
                f"--dtype {dtype}: this checkout's sr.models.load_model(path, device) has no "
                "dtype parameter yet (sr serves float32 only); rerun with --dtype float32"
            )
        return load_model(folder, device)
    try:
        return load_model(folder, device, dtype=dtype)
    except TypeError:  # a load_model that takes torch dtypes rather than their names
        return load_model(folder, device, dtype=DTYPES[dtype])


def load_sr_ort(folder: Path) -> tuple[object | None, dict]:
    """sr's onnxruntime engine on `folder` (CPU, float32) and what to record of it: its
    engine card and load time, or `refused` with the message of UnsupportedModel."""
    from sr.models import UnsupportedModel, load_model

    started = time.perf_counter()
    try:
        model = load_model(folder, "cpu", engine="onnxruntime")
    except UnsupportedModel as error:
        return None, {"refused": str(error)}
    return model, {"load_s": round(time.perf_counter() - started, 2)}


class Reference:
    """transformers on padded rows: AutoModel's forward + sentence-transformers' pooling
    (`embed`), or AutoModelForTokenClassification's logits of the real tokens
    (`token_logits`), whichever `head` names."""

    def __init__(self, folder: Path, spec: FamilySpec, device: str, dtype: str, head: Head):
        import transformers

        auto = getattr(transformers, head.auto_class)
        model = auto.from_pretrained(folder, dtype=DTYPES[dtype])
        self.model = model.to(device).eval()
        self.device = torch.device(device)
        self.spec = spec
        pad = self.model.config.pad_token_id
        self.pad_id = 0 if pad is None or pad >= self.model.config.vocab_size else int(pad)
        self.attn_implementation = getattr(self.model.config, "_attn_implementation", None)
        # The Dense modules after pooling (float32, as sr runs them), if the family has any.
        self.dense = [w.to(self.device) for w in dense_weights(folder, spec)]

    def _pad(self, batch: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        longest = max(len(row) for row in batch)
        ids, mask = [], []
        for row in batch:
            fill = longest - len(row)
            if self.spec.padding_side == "left":
                ids.append([self.pad_id] * fill + row)
                mask.append([0] * fill + [1] * len(row))
            else:
                ids.append(row + [self.pad_id] * fill)
                mask.append([1] * len(row) + [0] * fill)
        return (
            torch.tensor(ids, dtype=torch.long, device=self.device),
            torch.tensor(mask, dtype=torch.long, device=self.device),
        )

    def embed(self, batch: list[list[int]]) -> torch.Tensor:
        ids, mask = self._pad(batch)
        with torch.inference_mode():
            hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
            pooled = self._pool(hidden, mask)
            if self.dense:
                pooled = pooled.float()
                for weight in self.dense:
                    pooled = F.linear(pooled, weight)
            if self.spec.normalize:
                pooled = F.normalize(pooled, p=2.0, dim=1)
            return pooled.float().cpu()

    def token_logits(self, batch: list[list[int]]) -> torch.Tensor:
        """[T, labels]: every real token's logits, row after row (sr's packed order)."""
        ids, mask = self._pad(batch)
        with torch.inference_mode():
            logits = self.model(input_ids=ids, attention_mask=mask).logits
            return logits[mask.bool()].float().cpu()

    def _pool(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # sentence_transformers.models.Pooling's formulas.
        if self.spec.pooling == "mean":
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        if self.spec.pooling == "lasttoken":
            if self.spec.padding_side == "left":
                return hidden[:, -1]
            last = mask.sum(1) - 1
            return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        if self.spec.pooling == "cls":
            return hidden[:, 0]
        raise ValueError(f"pooling {self.spec.pooling!r}")


def load_st(folder: Path, device: str, dtype: str):
    import sentence_transformers

    return sentence_transformers.SentenceTransformer(
        str(folder), device=device, model_kwargs={"dtype": DTYPES[dtype]}
    )


def st_encode(st, texts: list[str]) -> torch.Tensor:
    out = st.encode(texts, batch_size=BATCH, convert_to_tensor=True, show_progress_bar=False)
    return out.float().cpu()


# -- timing ---------------------------------------------------------------------------------


def alternating(sides: Sequence[Callable[[], object]], runs: int) -> list[list[float]]:
    """Seconds of each run of every side, one list per side; the order rotates run by run,
    so each side goes first (and last) as often as the others."""
    seconds: list[list[float]] = [[] for _ in sides]
    for i in range(runs):
        for k in range(len(sides)):
            j = (i + k) % len(sides)
            started = time.perf_counter()
            sides[j]()
            seconds[j].append(time.perf_counter() - started)
    return seconds


def profile_table(fn: Callable[[], object], runs: int = 3, rows: int = 12) -> str:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        for _ in range(runs):
            fn()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


# -- one family -----------------------------------------------------------------------------


def bench_family(name: str, args, workdir: Path) -> dict:
    spec = FAMILIES[name]
    head = HEADS[args.head]
    started = time.perf_counter()
    folder = cached_family(name, workdir, layers=args.layers, head=head.name)
    built_s = time.perf_counter() - started
    model = load_sr(folder, args.device, args.dtype)
    if head.name == TOKEN and model.head_task != TOKEN:
        raise SystemExit(f"{name}: sr loaded {folder} with head {model.head_task!r}, not token")
    use_st = args.reference == "sentence-transformers"
    reference = None if use_st else Reference(folder, spec, args.device, args.dtype, head)
    st = None
    if use_st or (args.st_check and head.name == EMBED and _have_st()):
        st = load_st(folder, args.device, args.dtype)
    ort, ort_record = load_sr_ort(folder) if args.ort else (None, {"skipped": args.ort_skip})
    if ort is not None:
        ort_record["engine"] = ort.engine_card

    texts = make_texts(model.tokenizer)
    result: dict = {
        "family": name,
        "head": head.name,
        "like": spec.like,
        "config": spec.describe(args.layers, head.name),
        "layers": args.layers or spec.layers,
        "build_s": round(built_s, 1),
        "reference_attn_implementation": reference.attn_implementation if reference else None,
        "sr_ort": ort_record,
        "cases": {},
    }
    print(f"\n== {name}: {result['config']}", flush=True)
    if "refused" in ort_record:
        print(f"  sr_ort refused: {ort_record['refused']}", flush=True)
    elif ort is not None:
        card = ort_record["engine"]
        print(
            f"  sr_ort: graph {card.get('graph')}, export {card.get('export')}, "
            f"loaded in {ort_record['load_s']} s",
            flush=True,
        )

    # The method timed on each side: embed, or token_logits with --head token.
    sr_run = getattr(model, head.method)
    reference_run = getattr(reference, head.method) if reference else None
    ort_run = getattr(ort, head.method) if ort is not None else None
    for case, case_texts in texts.items():
        ids = model.tokenize(case_texts)
        if use_st:

            def ours(t=case_texts):
                return model.embed(model.tokenize(t))

            def theirs(t=case_texts):
                return st_encode(st, t)

            def ours_ort(t=case_texts):
                return ort.embed(ort.tokenize(t))
        else:

            def ours(b=ids):
                return sr_run(b)

            def theirs(b=ids):
                return reference_run(b)

            def ours_ort(b=ids):
                return ort_run(b)

        sides = [ours, theirs] if ort is None else [ours, ours_ort, theirs]
        ours_out = ours()
        diff = _max_diff(ours_out, theirs())
        ort_diff = _max_diff(ours_ort(), ours_out) if ort is not None else None
        runs = args.batch_runs if case == "batch32" else args.runs
        warm = max(2, runs // 5)
        alternating(sides, warm)
        timed = alternating(sides, runs)
        ours_s, theirs_s = timed[0], timed[-1]
        sr_ms, ref_ms = statistics.median(ours_s) * 1e3, statistics.median(theirs_s) * 1e3
        lengths = [len(row) for row in ids]
        entry = {
            "texts": len(ids),
            "tokens": sum(lengths),
            "padded_tokens": len(ids) * max(lengths),
            "lengths": lengths if len(lengths) > 1 else lengths[0],
            "runs": runs,
            "sr_ms": round(sr_ms, 3),
            "reference_ms": round(ref_ms, 3),
            "sr_ms_all": [round(v * 1e3, 3) for v in ours_s],
            "reference_ms_all": [round(v * 1e3, 3) for v in theirs_s],
            "max_abs_diff": diff,
        }
        # Per adjacent pair (same moment, same load): steadier than the medians' ratio on a
        # busy host. For batch32 it is the throughput ratio (reference time / sr time).
        pairs = [a / b for a, b in zip(ours_s, theirs_s, strict=True)]
        if case == "batch32":
            entry["paired_ratio"] = round(statistics.median(1 / p for p in pairs), 3)
            entry["sr_texts_per_s"] = round(len(ids) / (sr_ms / 1e3), 1)
            entry["reference_texts_per_s"] = round(len(ids) / (ref_ms / 1e3), 1)
            entry["ratio"] = round(entry["sr_texts_per_s"] / entry["reference_texts_per_s"], 3)
            entry["target"] = f">= {THROUGHPUT_TARGET}"
            entry["met"] = entry["ratio"] >= THROUGHPUT_TARGET
        else:
            entry["paired_ratio"] = round(statistics.median(pairs), 3)
            entry["ratio"] = round(sr_ms / ref_ms, 3)
            entry["target"] = f"<= {LATENCY_TARGET}"
            entry["met"] = entry["ratio"] <= LATENCY_TARGET
        if ort is not None:
            entry.update(_ort_entry(case, len(ids), ours_s, timed[1], ort_diff, head))
        result["cases"][case] = entry
        print(
            f"  {case}: {entry['tokens']} tokens, sr {sr_ms:.2f} ms, reference {ref_ms:.2f} ms, "
            f"ratio {entry['ratio']} (paired {entry['paired_ratio']}), max abs diff {diff:.2e}",
            flush=True,
        )
        if ort is not None:
            print(
                f"  {case}: sr_ort {entry['sr_ort_ms']:.2f} ms, ort/sr {entry['ort_ratio']} "
                f"(paired {entry['ort_paired_ratio']}), max abs diff to sr {ort_diff:.2e}",
                flush=True,
            )
        if args.profile:
            profiled = [("sr", ours), ("reference", theirs)]
            if ort is not None:
                profiled.insert(1, ("sr_ort", ours_ort))
            for side, fn in profiled:
                print(f"\n-- profile {name} {case} {side} (3 runs)\n{profile_table(fn)}")

    if st is not None and not use_st:
        # The reference's pooling is sentence-transformers' own: same texts through encode.
        batch = texts["batch32"]
        want = st_encode(st, batch)
        got = reference.embed(model.tokenize(batch))
        result["st_vs_reference_max_abs_diff"] = _max_diff(got, want)
        result["st_vs_sr_max_abs_diff"] = _max_diff(model.embed(model.tokenize(batch)), want)
        print(
            f"  sentence-transformers encode vs reference: "
            f"{result['st_vs_reference_max_abs_diff']:.2e}, vs sr: "
            f"{result['st_vs_sr_max_abs_diff']:.2e}",
            flush=True,
        )
    return result


def _ort_entry(
    case: str, texts: int, sr_s: list[float], ort_s: list[float], diff: float, head: Head
) -> dict:
    """sr_ort's fields of a case: its times, its ratio to sr torch's (ms over ms on short
    and long; texts/s over texts/s on batch32, as the reference's ratio reads) and the max
    abs diff of its output to sr torch's (checked against ORT_EMBED_TOLERANCE for
    embeddings, reported only for token logits)."""
    sr_ms, ort_ms = statistics.median(sr_s) * 1e3, statistics.median(ort_s) * 1e3
    pairs = [o / t for o, t in zip(ort_s, sr_s, strict=True)]
    entry: dict = {
        "sr_ort_ms": round(ort_ms, 3),
        "sr_ort_ms_all": [round(v * 1e3, 3) for v in ort_s],
        "ort_max_abs_diff_to_sr": diff,
    }
    if case == "batch32":
        entry["sr_ort_texts_per_s"] = round(texts / (ort_ms / 1e3), 1)
        entry["ort_ratio"] = round(sr_ms / ort_ms, 3)
        entry["ort_paired_ratio"] = round(statistics.median(1 / p for p in pairs), 3)
    else:
        entry["ort_ratio"] = round(ort_ms / sr_ms, 3)
        entry["ort_paired_ratio"] = round(statistics.median(pairs), 3)
    if head.name == EMBED:
        entry["ort_diff_target"] = f"<= {ORT_EMBED_TOLERANCE}"
        entry["ort_diff_met"] = diff <= ORT_EMBED_TOLERANCE
    return entry


def _have_st() -> bool:
    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        return False
    return True


def _versions() -> dict:
    import transformers

    out = {"torch": torch.__version__, "transformers": transformers.__version__}
    with contextlib.suppress(ImportError):
        import sentence_transformers

        out["sentence_transformers"] = sentence_transformers.__version__
    return out


def _sr_tree_state() -> list[str]:
    """Uncommitted changes under sr/models at run time (other work in progress shows here)."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--", "sr/models"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--families",
        nargs="+",
        choices=list(FAMILIES),
        default=None,
        help="default: all (with --head token: those whose sr model serves a token head)",
    )
    parser.add_argument(
        "--head",
        choices=list(HEADS),
        default=EMBED,
        help="embed (default: the bare model's pooled embeddings) or token (the "
        "token-classification head's per-token logits)",
    )
    parser.add_argument("--runs", type=int, default=40, help="timed runs of short and long")
    parser.add_argument("--batch-runs", type=int, default=5, help="timed runs of batch32")
    parser.add_argument("--layers", type=int, default=None, help="default: each family's own")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda:N")
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument(
        "--reference", choices=("transformers", "sentence-transformers"), default="transformers"
    )
    parser.add_argument(
        "--no-ort",
        dest="ort",
        action="store_false",
        help="skip the sr_ort side (sr's onnxruntime engine; run at cpu float32 only)",
    )
    parser.add_argument(
        "--no-st-check",
        dest="st_check",
        action="store_false",
        help="skip the sentence-transformers encode agreement check",
    )
    parser.add_argument(
        "--models-dir",
        type=Path,
        default=None,
        help="keep the built models here and reuse them on later runs (default: a temp dir)",
    )
    parser.add_argument("--profile", action="store_true", help="print torch profiler tables")
    parser.add_argument(
        "--out",
        default=None,
        help="bench/results/<OUT>.json (default: families, or families-token with --head token)",
    )
    args = parser.parse_args(argv)
    head = HEADS[args.head]
    args.out = args.out or head.out
    if args.families is None:
        args.families = token_head_families() if head.name == TOKEN else list(FAMILIES)
    elif head.name == TOKEN:
        without = [n for n in args.families if n not in token_head_families()]
        if without:
            parser.error(
                f"--head token: sr serves no token-classification head for {', '.join(without)} "
                f"(families with one: {', '.join(token_head_families())})"
            )
    if head.name == TOKEN and args.reference == "sentence-transformers":
        parser.error("--head token: sentence-transformers has no token head; use the default")
    if args.device != "cpu" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: torch sees no GPU here")
    if args.reference == "sentence-transformers" and not _have_st():
        raise SystemExit("--reference sentence-transformers: pip install '.[bench]' first")

    args.ort_skip = None if args.ort else "--no-ort"
    if args.ort and (args.device != "cpu" or args.dtype != "float32"):
        args.ort, args.ort_skip = False, f"--device {args.device} --dtype {args.dtype}"
        print(
            f"sr_ort skipped: sr's onnxruntime engine serves float32 on the CPU only, not "
            f"{args.ort_skip}",
            flush=True,
        )

    torch.set_num_threads(args.threads)
    quiet_transformers()
    started = time.perf_counter()
    results = []
    with contextlib.ExitStack() as stack:
        models = args.models_dir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="sr-bench-families-"))
        )
        for name in args.families:
            results.append(bench_family(name, args, models))

    rows = []
    ort_missed = []
    for family in results:
        ort_record = family["sr_ort"]
        graph = ort_record.get("engine", {}).get("graph", "")
        for case, c in family["cases"].items():
            if case == "batch32":
                unit, ours, theirs = "texts/s", c["sr_texts_per_s"], c["reference_texts_per_s"]
                ort_value = c.get("sr_ort_texts_per_s")
            else:
                unit, ours, theirs = "ms", c["sr_ms"], c["reference_ms"]
                ort_value = c.get("sr_ort_ms")
            verdict = "met" if c["met"] else "MISSED"
            if "sr_ort_ms" in c:
                ort_cells = (
                    c["ort_ratio"],
                    c["ort_paired_ratio"],
                    f"{c['ort_max_abs_diff_to_sr']:.1e}"
                    + ("" if c.get("ort_diff_met", True) else " MISSED"),
                    graph,
                )
                if not c.get("ort_diff_met", True):
                    ort_missed.append(f"{family['family']} {case}")
            else:
                ort_value = "refused" if "refused" in ort_record else "skipped"
                ort_cells = ("", "", "", "")
            rows.append(
                (
                    family["family"],
                    case,
                    c["tokens"],
                    unit,
                    ours,
                    ort_value,
                    theirs,
                    c["ratio"],
                    c["paired_ratio"],
                    f"{c['target']} {verdict}",
                    f"{c['max_abs_diff']:.1e}",
                    *ort_cells,
                )
            )
    print()
    print(
        f"device {args.device}, {args.dtype}, {args.threads} thread(s), head {args.head}, "
        f"reference {args.reference}; ratio = sr/reference of the medians (ms: lower is "
        "better for sr; texts/s: higher is better); paired = median of the run-by-run "
        "ratios; the target verdict reads the ratio. sr_ort = sr's onnxruntime engine; "
        "ort/sr = sr_ort over sr torch in the row's unit (ms: lower is better for sr_ort; "
        "texts/s: higher is better); ort diff = max abs diff of sr_ort's output to sr "
        f"torch's ({'at most ' + str(ORT_EMBED_TOLERANCE) if head.name == EMBED else 'reported'})"
    )
    header = (
        "family",
        "case",
        "tokens",
        "unit",
        "sr",
        "sr_ort",
        "reference",
        "ratio",
        "paired",
        "target",
        "max abs diff",
        "ort/sr",
        "ort paired",
        "ort diff",
        "graph",
    )
    print_table(header, rows)
    for family in results:
        if "refused" in family["sr_ort"]:
            print(f"sr_ort refused for {family['family']}: {family['sr_ort']['refused']}")
    write_result(
        args.out,
        {
            "device": args.device,
            "dtype": args.dtype,
            "threads": args.threads,
            "head": args.head,
            "reference": args.reference,
            "targets": {
                "latency_ratio_max": LATENCY_TARGET,
                "throughput_ratio_min": THROUGHPUT_TARGET,
                "ort_embed_max_abs_diff": ORT_EMBED_TOLERANCE,
            },
            "sr_ort": "skipped: " + args.ort_skip if args.ort_skip else "run",
            "versions": _versions(),
            "platform": platform.platform(),
            "sr_models_uncommitted": _sr_tree_state(),
            "wall_s": round(time.perf_counter() - started, 1),
            "families": results,
        },
    )
    if ort_missed:
        print(
            f"sr_ort's embeddings differ from sr torch's by more than {ORT_EMBED_TOLERANCE}: "
            f"{', '.join(ort_missed)}"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
