"""sr against ONNX Runtime on the embedded MiniLM, at equal threads, sides alternating.

    python -m bench.bench_onnx [--threads 1 2] [--rounds 5] [--singles 30] [--no-serve]
        [--no-bf16] [--graphs fused plain] [--isolate [--unplaced]]

The ONNX model is made here, in a temporary folder, from the same weights sr serves:
transformers' BertModel (eager attention) + sentence-transformers' mean pooling + L2
normalisation, exported with `torch.onnx.export` (the TorchScript exporter, dynamic batch
and sequence axes), fp32, in two graphs: `plain`, left to ORT's built-in session
optimizations, and `fused`, after ONNX Runtime's own BERT fusions
(onnxruntime.transformers.optimizer: Attention, SkipLayerNormalization,
EmbedLayerNormalization, BiasGelu), what Optimum's ORTOptimizer runs for engines such as
infinity-emb's. Which of the two is faster depends on the case and the host, so both
run and sr is read against the faster one per case. Each session runs on the CPU
execution provider with intra_op_num_threads = N, inter_op_num_threads = 1, sequential
execution; ORT gets its texts through the checkpoint's own tokenizer.json (padding to the
longest row, truncation at max_seq_length), as a transformers pipeline would.

Sides, per thread count N, alternating round by round (the order rotates):
  * sr: the in-process engine, `embed(truncate(tokenize(texts)))` at torch.set_num_threads(N);
  * sr_bf16: the same engine with its weights and activations in bfloat16, what the
    `throughput` profile serves on CPUs with native bfloat16 (sr.config.precision; skipped
    with --no-bf16). Its deviation from float32 is measured on the golden set against
    the recorded float32 references (the golden check a worker runs at start: max abs
    diff, least cosine) and, for information, against sr fp32 on the texts of the check;
  * sr serve: end to end through `sr serve --threads N` (one worker, caches off), one
    POST /v1/embeddings per case (skipped with --no-serve);
  * ort_fused, ort_plain: tokenize, pad, `session.run`.
Cases: (a) 32 medium (~120-token) texts in one call / one request: throughput (texts/s) and
CPU per text; (b) one short (~10-token) text and (c) one medium text: latency (median ms).
With --isolate, sr, sr_bf16 and each ORT graph run in a process of their own, fed over a
pipe (the check of agreement still runs in this one): at 2 threads on a 2-core host an ORT
session's pool threads spin after each run and, in one process, take the next side's core.
An isolated sr keeps its OpenMP peers off its own CPU as a worker does (sr.worker.placement);
--unplaced adds `sr_unplaced`, the same engine without that, as a control.
Ratios are sr over the faster ORT graph of the case (`best_ort`), per adjacent pair
(`paired`, steadier on a busy host) and of the medians.
Before timing, sr's and ORT's vectors of 200 varied texts and of the batch are compared
(max abs diff, min cosine): the two compute the same function.
The targets: at 1 thread sr >= 1.2x ORT's throughput on (a) and <= 1.0x its latency
on (b) and (c); at 2 threads <= 1.0x on (c); the throughput profile (sr_bf16) at 1 thread
>= 2x ORT fp32's throughput on (a) with least cosine to float32 >= 0.999 on the golden set.
Writes bench/results/onnx.json.
Needs onnxruntime and onnx (pip install '.[bench]').
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import trio

from bench.bench_profile import case_texts
from bench.harness import ServeProcess, embedded_artifact, http_client, print_table, write_result
from sr.pool.fork_start import WORKER_SPIN_COUNT

BATCH = 32
MAX_ABS_DIFF = 1e-5  # the same function in fp32: a few ulps of the vectors' entries
MIN_COSINE = 0.99999
THROUGHPUT_TARGET_1T = 1.2  # sr texts/s over ORT's, at least (1 thread)
BF16_THROUGHPUT_TARGET_1T = 2.0  # sr bf16 (the throughput profile) over ORT fp32, at least
BF16_MIN_COSINE = 0.999  # sr bf16's least cosine to float32 on the golden set, at least
LATENCY_TARGET = 1.0  # sr ms over ORT's, at most
# One text through `sr serve` (either engine) over ORT's forward in process, at most (1 thread)
SERVE_SHORT_TARGET = 1.3
SERVE_MEDIUM_TARGET = 1.15


# -- the ONNX model --------------------------------------------------------------------------


class _PooledBert(torch.nn.Module):
    """BertModel + sentence-transformers' Pooling(mean) + Normalize, as one graph."""

    def __init__(self, bert: torch.nn.Module):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, p=2.0, dim=1)


GRAPHS = ("fused", "plain")


@dataclass(frozen=True)
class Exported:
    path: Path
    graph: str  # "fused" or "plain"
    export_s: float
    nodes: dict[str, int]  # op type -> count in the file ORT loads


def export_onnx(
    folder: Path, workdir: Path, graphs: list[str] | tuple[str, ...] = GRAPHS
) -> dict[str, Exported]:
    """The checkpoint in `folder` as fp32 ONNX files under `workdir`, one per graph in
    `graphs` (see the module doc)."""
    import onnx
    import transformers

    started = time.perf_counter()
    # Eager attention: its MatMul/Softmax pattern is what ORT's Attention fusion matches
    # (an SDPA export carries IsNaN/Where guards that keep the fusion from firing).
    bert = transformers.BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    ids = torch.randint(1000, 2000, (2, 16))
    raw = workdir / "minilm.onnx"
    axes = {0: "batch", 1: "sequence"}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _PooledBert(bert),
            (ids, torch.ones_like(ids)),
            str(raw),
            input_names=["input_ids", "attention_mask"],
            output_names=["sentence_embedding"],
            dynamic_axes={
                "input_ids": axes,
                "attention_mask": axes,
                "sentence_embedding": {0: "batch"},
            },
            opset_version=17,
            dynamo=False,
        )
    exported_s = time.perf_counter() - started
    out = {}
    for graph in graphs:
        started = time.perf_counter()
        path = raw
        if graph == "fused":
            from onnxruntime.transformers.optimizer import optimize_model

            logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
            fused = optimize_model(
                str(raw),
                model_type="bert",
                num_heads=bert.config.num_attention_heads,
                hidden_size=bert.config.hidden_size,
                opt_level=1,
            )
            path = workdir / "minilm-fused.onnx"
            fused.save_model_to_file(str(path))
        nodes: dict[str, int] = {}
        for node in onnx.load(str(path)).graph.node:
            nodes[node.op_type] = nodes.get(node.op_type, 0) + 1
        seconds = round(exported_s + time.perf_counter() - started, 1)
        out[graph] = Exported(path, graph, seconds, nodes)
    return out


class OrtEmbedder:
    """An ORT session on the CPU provider at `threads` intra-op threads (inter-op 1,
    sequential), fed token ids or texts."""

    def __init__(
        self,
        path: Path,
        threads: int,
        *,
        tokenizer_folder: Path | None = None,
        max_length: int = 512,
        profile_dir: Path | None = None,
    ):
        import onnxruntime

        self._ort = onnxruntime
        self.path = path
        self.threads = threads
        self.profile_dir = profile_dir
        self.session = self._session()
        self.tokenizer = None
        if tokenizer_folder is not None:
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_file(str(tokenizer_folder / "tokenizer.json"))
            tokenizer.no_padding()  # the shipped file pads to a fixed 128
            pad_id = tokenizer.token_to_id("[PAD]") or 0
            tokenizer.enable_padding(pad_id=pad_id, pad_token="[PAD]")
            tokenizer.enable_truncation(max_length)
            self.tokenizer = tokenizer

    def _session(self, profile_prefix: str | None = None):
        options = self._ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.execution_mode = self._ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = self._ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        if profile_prefix is not None:
            options.enable_profiling = True
            options.profile_file_prefix = profile_prefix
        return self._ort.InferenceSession(
            str(self.path), options, providers=["CPUExecutionProvider"]
        )

    @staticmethod
    def _padded(batch: list[list[int]]) -> dict[str, np.ndarray]:
        longest = max(len(row) for row in batch)
        ids = np.zeros((len(batch), longest), dtype=np.int64)
        mask = np.zeros((len(batch), longest), dtype=np.int64)
        for i, row in enumerate(batch):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        return {"input_ids": ids, "attention_mask": mask}

    def embed_ids(self, batch: list[list[int]]) -> np.ndarray:
        return self.session.run(None, self._padded(batch))[0]

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        if self.tokenizer is None:
            raise ValueError("OrtEmbedder was made without tokenizer_folder")
        encodings = self.tokenizer.encode_batch(texts)
        feed = {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        }
        return self.session.run(None, feed)[0]

    def profile(self, batch: list[list[int]], forwards: int) -> dict[str, tuple[float, int]]:
        """op type -> (total kernel ms, calls) over `forwards` runs, from ORT's profiler
        (a session of its own; its first run, which warms up, is left out)."""
        if self.profile_dir is None:
            raise ValueError("OrtEmbedder was made without profile_dir")
        session = self._session(str(self.profile_dir / f"ort-{self.threads}t"))
        feed = self._padded(batch)
        for _ in range(forwards + 1):
            session.run(None, feed)
        events = json.loads(Path(session.end_profiling()).read_text())
        runs = sorted(
            (e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
            key=lambda e: e["ts"],
        )
        warm_end = runs[0]["ts"] + runs[0]["dur"] if runs else 0
        totals: dict[str, tuple[float, int]] = {}
        for e in events:
            if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
                continue
            if e["ts"] < warm_end:
                continue
            op = e["args"]["op_name"]
            ms, calls = totals.get(op, (0.0, 0))
            totals[op] = (ms + e["dur"] / 1e3, calls + 1)
        return totals


# -- agreement -----------------------------------------------------------------------------


def agreement(
    model, embedder: OrtEmbedder, texts: list[str], limit: int, *, ours_model=None
) -> dict:
    """Max abs diff and min cosine between sr's and ORT's vectors of the same token ids
    (sr's from `ours_model` when given, e.g. the bfloat16 engine, tokenized by `model`)."""
    ids = [model.truncate(row, limit) for row in model.tokenize(texts)]
    engine = ours_model or model
    ours = torch.cat([engine.embed(ids[i : i + BATCH]) for i in range(0, len(ids), BATCH)])
    theirs = torch.from_numpy(
        np.concatenate([embedder.embed_ids(ids[i : i + BATCH]) for i in range(0, len(ids), BATCH)])
    )
    cosine = F.cosine_similarity(ours, theirs, dim=1)
    return {
        "texts": len(texts),
        "max_abs_diff": float((ours - theirs).abs().max()),
        "min_cosine": float(cosine.min()),
    }


class _SrEmbedder:
    """An sr model in the place of an OrtEmbedder for `agreement` (its vectors as numpy)."""

    def __init__(self, model, limit: int):
        self.model, self.limit = model, limit

    def embed_ids(self, batch: list[list[int]]) -> np.ndarray:
        return self.model.embed(batch).numpy()


# -- timing --------------------------------------------------------------------------------


@dataclass
class Side:
    """One system under test: embeds texts (awaitable), and tells its CPU seconds so far."""

    embed: Callable[[list[str]], Awaitable[None]]
    cpu_seconds: Callable[[], float]


def in_process(fn: Callable[[list[str]], object]) -> Side:
    async def embed(texts: list[str]) -> None:
        fn(texts)

    return Side(embed, time.process_time)


# With --isolate, the untimed pause before each side's run: a process's idle pool threads
# (ORT's spin after a run; libgomp's after a parallel region) stop spinning well within it.
# 0.1 s was not enough at 2 threads: sr's 32-text batch ran at 36.5 texts/s after it and
# 59.5 after 0.5 s (ORT 48 -> 58), while sr alone in process takes the same time after a
# 0.1 s sleep as back to back (docs/benchmarks-history.md).
SETTLE_S = 0.5


class ChildSide:
    """A side in a process of its own (`--isolate`): on a 2-core host an ORT session's pool
    threads spin after each run, and in one process they take the second core from the
    next side's run. The child embeds what it is sent and answers its own CPU seconds."""

    def __init__(self, spec: dict):
        import os
        import subprocess
        import sys

        env = dict(os.environ)
        # as sr's pool sets it for its workers
        env.setdefault("GOMP_SPINCOUNT", str(WORKER_SPIN_COUNT))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.bench_onnx", "--child", json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self.cpu = 0.0
        self._exchange({"ping": True})  # loaded and ready before any timing

    def _exchange(self, message: dict) -> dict:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"bench child {self.process.args[-1]} died")
        return json.loads(line)

    def side(self) -> Side:
        async def embed(texts: list[str]) -> None:
            # Blocking on purpose: sides run one at a time, and a thread hop would be timed.
            self.cpu += self._exchange({"texts": texts})["cpu"]

        return Side(embed, lambda: self.cpu)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=30)


def child_main(spec: dict) -> None:
    """The child of a ChildSide: load the side's engine, then embed each line's texts."""
    import sys

    torch.set_num_threads(spec["threads"])
    if spec["kind"] == "ort":
        embed = OrtEmbedder(
            Path(spec["path"]), spec["threads"], tokenizer_folder=Path(spec["folder"]),
            max_length=spec["limit"],
        ).embed_texts  # fmt: skip
    else:
        from sr.models import load_model
        from sr.worker.placement import placement_for

        model = load_model(
            Path(spec["folder"]), dtype=spec["dtype"], engine=spec.get("engine", "torch")
        )
        model.calibrate_threads()
        forward = engine_embed(model, spec["limit"])
        # as a worker places its OpenMP peers (sr.worker.service), unless this is the control
        placement = placement_for(spec["threads"])[0] if spec.get("place", True) else None

        def embed(texts: list[str]) -> object:
            if placement is not None:
                placement.before_forward()
            return forward(texts)

    for line in sys.stdin:
        message = json.loads(line)
        cpu = time.process_time()
        if "texts" in message:
            embed(message["texts"])
        sys.stdout.write(json.dumps({"cpu": time.process_time() - cpu}) + "\n")
        sys.stdout.flush()


def served(client, serve: ServeProcess) -> Side:
    async def embed(texts: list[str]) -> None:
        payload = texts[0] if len(texts) == 1 else texts
        body = json.dumps({"model": "primary", "input": payload}).encode()
        status, _, answer = await client.request("POST", "/v1/embeddings", body)
        if status != 200:
            raise SystemExit(f"sr serve answered {status}: {answer[:200]!r}")

    return Side(embed, lambda: serve.cpu_seconds()["workers"])


async def alternate(
    sides: dict[str, Side], make_texts: Callable[[int], list[str]], runs: int, settle_s: float = 0
) -> dict[str, dict[str, list[float]]]:
    """Wall and CPU seconds of `runs` rounds; every side embeds the round's texts, in an
    order that rotates round by round. `settle_s` (untimed) before each side's run lets
    the previous side's pool threads stop spinning."""
    names = list(sides)
    out = {name: {"wall": [], "cpu": []} for name in names}
    for i in range(runs):
        texts = make_texts(i)
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            side = sides[name]
            if settle_s:
                time.sleep(settle_s)
            cpu = side.cpu_seconds()
            started = time.perf_counter()
            await side.embed(texts)
            out[name]["wall"].append(time.perf_counter() - started)
            out[name]["cpu"].append(side.cpu_seconds() - cpu)
    return out


def _stats(samples: dict[str, list[float]], texts: int) -> dict:
    wall = sorted(samples["wall"])
    median = statistics.median(wall)
    entry = {
        "median_ms": round(median * 1e3, 3),
        "p90_ms": round(wall[int(0.9 * (len(wall) - 1))] * 1e3, 3),
        # Mean, not median: a worker's CPU time comes in 10 ms clock ticks.
        "cpu_ms_per_text": round(sum(samples["cpu"]) * 1e3 / (texts * len(wall)), 3),
    }
    if texts > 1:
        entry["texts_per_s"] = round(texts / median, 1)
    return entry


def _paired(ours: list[float], theirs: list[float]) -> float:
    return round(statistics.median(a / b for a, b in zip(ours, theirs, strict=True)), 3)


async def measure(sides: dict[str, Side], tokenizer, args, serial: list[int]) -> dict:
    def texts_of(rows: str, count: int) -> Callable[[int], list[str]]:
        def make(_: int) -> list[str]:
            serial[0] += count
            return case_texts(tokenizer, rows, count, serial[0])

        return make

    cases = {
        "batch32_medium": (texts_of("medium", BATCH), args.rounds, BATCH),
        "single_short": (texts_of("short", 1), args.singles, 1),
        "single_medium": (texts_of("medium", 1), args.singles, 1),
    }
    out = {}
    for case, (make, runs, count) in cases.items():
        settle_s = SETTLE_S if args.isolate else 0
        await alternate(sides, make, max(2, runs // 5), settle_s)  # warm-up
        samples = await alternate(sides, make, runs, settle_s)
        entry = {name: _stats(s, count) for name, s in samples.items()}
        ort = [name for name in sides if name.startswith("ort_")]
        best = min(ort, key=lambda name: entry[name]["median_ms"])
        entry["best_ort"] = best
        for name in sides:
            if name in ort:
                continue
            ours, theirs = samples[name]["wall"], samples[best]["wall"]
            if count > 1:  # throughput: ORT's time over ours
                ratio = entry[best]["median_ms"] / entry[name]["median_ms"]
                entry[f"{name}_vs_ort"] = {
                    "throughput_ratio": round(ratio, 3),
                    "paired": _paired(theirs, ours),
                }
            else:
                ratio = entry[name]["median_ms"] / entry[best]["median_ms"]
                entry[f"{name}_vs_ort"] = {
                    "latency_ratio": round(ratio, 3),
                    "paired": _paired(ours, theirs),
                }
        out[case] = entry
    return out


def targets(threads: int, cases: dict, side: str) -> list[dict]:
    """The targets that apply to `side` at this thread count, read on the ratio of medians:
    the engine in process against ORT's throughput and latency; one text through `sr
    serve` against ORT's forward in process (the single-request path's)."""
    wanted = []
    if side in ("sr_serve", "sr_serve_ort"):
        if threads == 1:
            wanted = [
                ("single_short", "latency_ratio", "<=", SERVE_SHORT_TARGET),
                ("single_medium", "latency_ratio", "<=", SERVE_MEDIUM_TARGET),
            ]
    elif side == "sr_bf16":  # the throughput profile: 1 thread only
        if threads == 1:
            wanted = [("batch32_medium", "throughput_ratio", ">=", BF16_THROUGHPUT_TARGET_1T)]
    elif threads == 1:
        wanted = [
            ("batch32_medium", "throughput_ratio", ">=", THROUGHPUT_TARGET_1T),
            ("single_short", "latency_ratio", "<=", LATENCY_TARGET),
            ("single_medium", "latency_ratio", "<=", LATENCY_TARGET),
        ]
    elif threads == 2:
        wanted = [("single_medium", "latency_ratio", "<=", LATENCY_TARGET)]
    out = []
    for case, key, op, goal in wanted:
        measured = cases[case][f"{side}_vs_ort"][key]
        met = measured >= goal if op == ">=" else measured <= goal
        out.append({"case": case, "goal": f"{op} {goal}x", "measured": measured, "met": met})
    return out


# -- the run -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds of the batch case")
    parser.add_argument("--singles", type=int, default=30, help="timed rounds of each single")
    parser.add_argument("--no-serve", dest="serve", action="store_false", help="skip sr serve")
    parser.add_argument(
        "--no-bf16", dest="bf16", action="store_false", help="skip sr's bfloat16 side"
    )
    parser.add_argument(
        "--graphs", nargs="+", choices=GRAPHS, default=list(GRAPHS), help="ORT sides to run"
    )
    parser.add_argument("--out", default="onnx", help="bench/results/<OUT>.json")
    parser.add_argument(
        "--no-ort-engine", dest="ort_engine", action="store_false",
        help="skip sr's onnxruntime engine (sr_ort in process, sr_serve_ort)",
    )  # fmt: skip
    parser.add_argument(
        "--isolate", action="store_true",
        help="run sr and each ORT graph in a process of its own (no shared cores' spinning)",
    )  # fmt: skip
    parser.add_argument(
        "--unplaced", action="store_true",
        help="with --isolate, also run sr without its OpenMP peer placement (sr_unplaced)",
    )  # fmt: skip
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.unplaced and not args.isolate:
        parser.error("--unplaced needs --isolate (placement is per process)")
    if args.child is not None:
        child_main(json.loads(args.child))
        return {}

    import onnxruntime

    from bench.bench_engine import varied_texts
    from sr.models import golden_check, load_model, resolve_artifact

    started = time.perf_counter()
    artifact = embedded_artifact()
    folder = resolve_artifact(artifact)
    model = load_model(folder)
    limit = model.max_seq_length or model.max_position_embeddings
    model_bf16 = load_model(folder, dtype="bfloat16") if args.bf16 else None
    # the onnxruntime engine (sr.models.onnx_engine): its graph exported now or kept
    model_ort = load_model(folder, engine="onnxruntime") if args.ort_engine else None
    serial = [0]
    by_threads = []
    with tempfile.TemporaryDirectory(prefix="sr-bench-onnx-") as tmp:
        workdir = Path(tmp)
        exported = export_onnx(folder, workdir, args.graphs)
        for graph in exported.values():
            print(f"exported {graph.graph} graph in {graph.export_s} s: {graph.nodes}")
        for threads in args.threads:
            torch.set_num_threads(threads)
            model.calibrate_threads()
            if model_bf16 is not None:
                model_bf16.calibrate_threads()
            ort = {
                name: OrtEmbedder(e.path, threads, tokenizer_folder=folder, max_length=limit)
                for name, e in exported.items()
            }
            batch_texts = case_texts(model.tokenizer, "medium", BATCH)
            check = {}
            for name, embedder in ort.items():
                check[name] = agreement(model, embedder, varied_texts(), limit)
                check[name]["batch32_medium"] = agreement(model, embedder, batch_texts, limit)
            sides = {"sr": in_process(engine_embed(model, limit))}
            if model_ort is not None:
                # the same function as sr's torch engine, within its export's tolerance
                check["sr_ort_engine"] = agreement(model, _SrEmbedder(model_ort, limit),
                                                   varied_texts(), limit)  # fmt: skip
                sides["sr_ort"] = in_process(engine_embed(model_ort, limit))
            bf16 = None
            if model_bf16 is not None:
                bf16 = bf16_deviation(
                    model, model_bf16, ort, varied_texts(), batch_texts, limit, golden_check
                )
                sides["sr_bf16"] = in_process(engine_embed(model_bf16, limit))
            sides.update({f"ort_{name}": in_process(e.embed_texts) for name, e in ort.items()})
            children: list[ChildSide] = []
            if args.isolate:
                # the same engines, each in a process of its own (checked above in this one)
                base = {"threads": threads, "folder": str(folder), "limit": limit}
                specs = {"sr": {**base, "kind": "sr", "dtype": "float32"}}
                if model_ort is not None:
                    specs["sr_ort"] = {**specs["sr"], "engine": "onnxruntime"}
                if args.unplaced:
                    specs["sr_unplaced"] = {**specs["sr"], "place": False}
                if model_bf16 is not None:
                    specs["sr_bf16"] = {**base, "kind": "sr", "dtype": "bfloat16"}
                for name, e in exported.items():
                    specs[f"ort_{name}"] = {**base, "kind": "ort", "path": str(e.path)}
                children = [ChildSide(spec) for spec in specs.values()]
                sides = {name: child.side() for name, child in zip(specs, children, strict=True)}

            async def run(sides=sides, threads=threads) -> dict:
                if not args.serve:
                    return await measure(sides, model.tokenizer, args, serial)
                engines = ["torch", *(["onnxruntime"] if model_ort is not None else [])]
                async with contextlib.AsyncExitStack() as stack:
                    served_sides = {}
                    for engine in engines:
                        serve = stack.enter_context(
                            ServeProcess(artifact, workdir, threads=threads, engine=engine)
                        )
                        client = http_client(serve.url)
                        stack.push_async_callback(client.aclose)
                        name = "sr_serve" if engine == "torch" else "sr_serve_ort"
                        served_sides[name] = served(client, serve)
                    return await measure({**sides, **served_sides}, model.tokenizer, args, serial)

            try:
                cases = trio.run(run)
            finally:
                for child in children:
                    child.close()
            entry = {"threads": threads, "agreement": check, "cases": cases}
            if bf16 is not None:
                # apart from `agreement`: bfloat16 is not the same function to the bit
                entry["bf16"] = bf16
            entry["targets"] = {
                side: targets(threads, cases, side)
                for side in ("sr", "sr_ort", "sr_bf16", "sr_serve", "sr_serve_ort")
                if f"{side}_vs_ort" in cases["single_short"]
            }
            if bf16 is not None and threads == 1:
                cosine = bf16["golden"]["min_cosine"]
                bf16["target"] = {
                    "case": "golden_set",
                    "goal": f"min cosine to float32 >= {BF16_MIN_COSINE}",
                    "measured": cosine,
                    "met": cosine >= BF16_MIN_COSINE,
                }
            by_threads.append(entry)
            _print_threads(entry)

    result = {
        "benchmark": "sr vs ONNX Runtime, embedded MiniLM",
        "artifact": artifact,
        "graphs": {
            name: {"export_s": e.export_s, "onnx_nodes": e.nodes} for name, e in exported.items()
        },
        "versions": {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__},
        "rounds": args.rounds,
        "singles": args.singles,
        "serve": args.serve,
        "isolated": args.isolate,
        "wall_s": round(time.perf_counter() - started, 1),
        "by_threads": by_threads,
    }
    write_result(args.out, result)
    ok = all(
        check["max_abs_diff"] <= MAX_ABS_DIFF and check["min_cosine"] >= MIN_COSINE
        for t in by_threads
        for check in t["agreement"].values()
    )
    if not ok:
        raise SystemExit("sr and ORT disagree beyond the tolerance: not the same function")
    return result


def engine_embed(model, limit: int) -> Callable[[list[str]], object]:
    """Texts -> sr's vectors, in process: tokenize, truncate, one forward."""
    return lambda texts: model.embed([model.truncate(row, limit) for row in model.tokenize(texts)])


def bf16_deviation(
    model, model_bf16, ort: dict, texts: list[str], batch: list[str], limit: int, golden_check
) -> dict:
    """How far sr's bfloat16 answers are from float32: the worker's golden check (against
    the recorded float32 references), then sr fp32 and each ORT graph on `texts`/`batch`."""
    golden = golden_check(model_bf16)
    ids = [model.truncate(row, limit) for row in model.tokenize(texts)]
    ours = torch.cat([model_bf16.embed(ids[i : i + BATCH]) for i in range(0, len(ids), BATCH)])
    exact = torch.cat([model.embed(ids[i : i + BATCH]) for i in range(0, len(ids), BATCH)])
    return {
        "golden": {
            "status": golden.status,
            "against": golden.against,
            "max_abs_diff": golden.max_abs_diff,
            "min_cosine": golden.min_cosine,
        },
        "vs_sr_fp32": {
            "texts": len(texts),
            "max_abs_diff": float((ours - exact).abs().max()),
            "min_cosine": float(F.cosine_similarity(ours, exact, dim=1).min()),
        },
        **{
            f"vs_ort_{name}": {
                **agreement(model, embedder, texts, limit, ours_model=model_bf16),
                "batch32_medium": agreement(model, embedder, batch, limit, ours_model=model_bf16),
            }
            for name, embedder in ort.items()
        },
    }


def _print_threads(entry: dict) -> None:
    print(f"\n== {entry['threads']} thread(s)")
    if "bf16" in entry:
        golden, exact = entry["bf16"]["golden"], entry["bf16"]["vs_sr_fp32"]
        print(
            f"sr bf16 vs float32: golden set ({golden['against']}) max abs diff "
            f"{golden['max_abs_diff']:.2e}, min cosine {golden['min_cosine']:.6f}; "
            f"sr fp32 on {exact['texts']} varied texts: max abs diff "
            f"{exact['max_abs_diff']:.2e}, min cosine {exact['min_cosine']:.6f}"
        )
    for graph, check in entry["agreement"].items():
        print(
            f"sr vs ORT {graph} on {check['texts']} varied texts: max abs diff "
            f"{check['max_abs_diff']:.2e}, min cosine {check['min_cosine']:.7f} "
            f"(<= {MAX_ABS_DIFF:g}, >= {MIN_COSINE})"
        )
    cases = entry["cases"]
    first = cases["single_short"]
    sides = [
        s
        for s in (
            "sr",
            "sr_unplaced",
            "sr_ort",
            "sr_bf16",
            "sr_serve",
            "sr_serve_ort",
            *(k for k in first if k.startswith("ort_")),
        )
        if s in first
    ]
    ours = [s for s in sides if not s.startswith("ort_")]
    rows = []
    for case, c in cases.items():
        batch = "texts_per_s" in c["sr"]
        key, unit = ("texts_per_s", "texts/s") if batch else ("median_ms", "median ms")
        ratios = [c[f"{s}_vs_ort"] for s in ours]
        rows.append(
            (case, unit, *(c[s][key] for s in sides), c["best_ort"],
             *(f"{next(iter(r.values())):.2f}x (paired {r['paired']:.2f})" for r in ratios))
        )  # fmt: skip
        rows.append(
            (case, "CPU ms/text", *(c[s]["cpu_ms_per_text"] for s in sides), "",
             *("" for _ in ours))
        )  # fmt: skip
    print_table(("case", "unit", *sides, "best ORT", *(f"{s}/best ORT" for s in ours)), rows)
    for side, goals in entry["targets"].items():
        for goal in goals:
            verdict = "met" if goal["met"] else "not met"
            print(f"target {side} {goal['case']}: {goal['goal']}, {goal['measured']}x {verdict}")
    if "target" in entry.get("bf16", {}):
        goal = entry["bf16"]["target"]
        verdict = "met" if goal["met"] else "not met"
        print(f"target sr_bf16 {goal['case']}: {goal['goal']}, {goal['measured']:.6f} {verdict}")


if __name__ == "__main__":
    main()
