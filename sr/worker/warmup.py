"""Load-time measurements run on the device thread: token budget and batch invariance.

Both functions touch torch and therefore only ever run on the worker's device thread.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import attrs
import torch

from sr.errors import UsageError
from sr.models.limits import default_max_tokens, over_ceiling
from sr.worker.batching import Limits
from sr.worker.contention import (
    CoreYield,
    YieldPolicy,
    host_busy_seconds,
    host_cpu_unreadable,
    usable_cpus,
)
from sr.worker.options import WorkerOptions
from sr.worker.threads import THREADS

# CPU workers without configured caps (docs/decisions.md, "worker: CPU batch defaults").
CPU_MAX_NUM_SEQS = 64
CPU_MAX_NUM_BATCHED_TOKENS = 8192

# GPU calibration: a padded token costs roughly `embedding_dim * 4 bytes * this` of
# activation memory in a BERT-family forward (hidden states, FFN intermediates, attention
# and allocator slack together); half of the free memory is given to batches.
_GPU_BYTES_PER_TOKEN_PER_DIM = 4 * 64
_GPU_FREE_FRACTION = 0.5
_GPU_MAX_BATCHED_TOKENS = 65536
_GPU_MAX_NUM_SEQS = 256

# Texts of clearly different lengths: a mixed batch pads most rows.
_PROBE_TEXTS = (
    "ok",
    "route this to billing",
    "the quick brown fox jumps over the lazy dog near the river bank today",
    "a",
    "please summarise the following meeting notes and list every action item with its owner",
)


@attrs.frozen
class ProbeResult:
    passed: bool
    detail: str

    def card(self) -> dict:
        return {"passed": self.passed, "detail": self.detail}


def resolve_limits(options: WorkerOptions, model, *, mem_get_info=None) -> Limits:
    """Configured caps win; otherwise a CPU default or a budget calibrated from free memory.
    The input cap is `--max-tokens`, else the folder's own (sr.models.limits)."""
    max_input = max_input_tokens(options, model)
    budget = options.max_num_batched_tokens
    if budget is not None and budget < max_input:
        raise UsageError(
            f"--max-num-batched-tokens: must be >= the input cap ({max_input}, the model's own: "
            f"set --max-tokens to serve shorter inputs), got {budget}"
        )
    if options.max_num_seqs is not None and budget is not None:
        return Limits(options.max_num_seqs, budget, max_input, "configured")
    if options.device == "cpu":
        seqs, budget, source = CPU_MAX_NUM_SEQS, CPU_MAX_NUM_BATCHED_TOKENS, "cpu_default"
    else:
        seqs, budget = _calibrate_gpu(model, max_input, mem_get_info or torch.cuda.mem_get_info)
        source = "calibrated"
    if options.max_num_seqs is not None:
        seqs, source = options.max_num_seqs, "configured"
    if options.max_num_batched_tokens is not None:
        budget, source = options.max_num_batched_tokens, "configured"
    return Limits(seqs, max(budget, max_input), max_input, source)


def max_input_tokens(options: WorkerOptions, model) -> int:
    """`--max-tokens`, refused above what the model takes; without it, the folder's own
    (sr.models.limits: sentence_bert_config.json's max_seq_length, else the ceiling)."""
    ceiling = int(model.max_position_embeddings)
    if options.max_tokens is None:
        return default_max_tokens(getattr(model, "max_seq_length", None), ceiling)
    if options.max_tokens > ceiling:
        raise UsageError(over_ceiling("--max-tokens", options.max_tokens, ceiling))
    return options.max_tokens


def _calibrate_gpu(model, max_input: int, mem_get_info) -> tuple[int, int]:
    free_bytes, _total = mem_get_info(torch.device(str(model.device)))
    per_token = int(model.embedding_dim) * _GPU_BYTES_PER_TOKEN_PER_DIM
    budget = int(free_bytes * _GPU_FREE_FRACTION) // max(per_token, 1)
    budget = max(max_input, min(_GPU_MAX_BATCHED_TOKENS, budget))
    seqs = max(1, min(_GPU_MAX_NUM_SEQS, budget // 16))
    return seqs, budget


def batch_invariance_probe(model, runner, max_input_tokens: int) -> ProbeResult:
    """Do the same rows give bit-identical outputs alone and inside mixed-length batches?

    It runs the model as served, so at its dtype (`model.dtype`, float32 when absent):
    kernels of another precision may round a row differently by batch shape."""
    rows = _probe_rows(model, max_input_tokens)
    for name, forward in _probe_forwards(model):
        alone = [_run(runner, forward, [row])[0] for row in rows]
        for order in (rows, rows[::-1]):
            mixed = _run(runner, forward, order)
            for position, row in enumerate(order):
                expected = alone[rows.index(row)]
                if not torch.equal(mixed[position], expected):
                    diff = (mixed[position].double() - expected.double()).abs().max().item()
                    return ProbeResult(
                        False,
                        f"{name}: a {len(row)}-token row differs by {diff:.3g} in a mixed batch"
                        + _at_dtype(model),
                    )
    return ProbeResult(
        True,
        f"{len(rows)} rows of {len(set(map(len, rows)))} lengths bit-identical{_at_dtype(model)}",
    )


def _probe_rows(model, max_input_tokens: int) -> list[list[int]]:
    """The probe texts as the worker would serve them (tokenized, cut to the limit)."""
    return [model.truncate(ids, max_input_tokens) for ids in model.tokenize(list(_PROBE_TEXTS))]


def _probe_forwards(model) -> list[tuple[str, Callable]]:
    """The forwards a probe compares: embeddings, and the head's logits if there is one
    (a token-classification head's per token, split back into rows)."""
    forwards: list[tuple[str, Callable]] = [("embed", model.embed)]
    if model.head_labels and getattr(model, "head_task", None) == "token":
        forwards.append(("token", functools.partial(_token_rows, model)))
    elif model.head_labels:
        forwards.append(("classify", model.classify_logits))
    return forwards


def _token_rows(model, batch: list[list[int]]) -> list[torch.Tensor]:
    """A token head's logits as one [length, labels] tensor per row."""
    return list(model.token_logits(batch).split([len(row) for row in batch]))


def _cpu(out: torch.Tensor | list[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
    """A forward's answer on the CPU: one tensor with a row per text, or one per text."""
    if isinstance(out, list):
        return [t.detach().cpu() for t in out]
    return out.detach().cpu()


def _same(a, b) -> bool:
    if isinstance(a, list):
        return len(a) == len(b) and all(map(torch.equal, a, b))
    return torch.equal(a, b)


def _at_dtype(model) -> str:
    """` at bfloat16` for a model served in a reduced precision; empty at float32."""
    dtype = getattr(model, "dtype", torch.float32)
    return "" if dtype == torch.float32 else f" at {str(dtype).removeprefix('torch.')}"


def _run(runner, forward, batch: list[list[int]]):
    padded = len(batch) * max(len(r) for r in batch)
    with torch.inference_mode():
        return _cpu(runner.run(lambda: forward(batch), padded))


def yield_counts(configured: int) -> list[int]:
    """The counts a worker of `configured` threads may yield to (sr.worker.contention):
    its halvings down to 1 (2 -> [1]; 8 -> [4, 2, 1])."""
    counts = []
    count = configured // 2
    while count >= 1:
        counts.append(count)
        count //= 2
    return counts


def thread_count_probe(
    model, configured: int, use_threads, max_input_tokens: int
) -> tuple[list[int], str]:
    """Which of `yield_counts(configured)` give the configured count's bits on the probe
    rows batched (embeddings, and the head's logits if any): the counts yielding may use,
    and what was found. `use_threads(n)` is the context that runs torch at n threads."""
    rows = _probe_rows(model, max_input_tokens)
    forwards = [forward for _, forward in _probe_forwards(model)]

    def outputs(threads: int) -> list[torch.Tensor]:
        with use_threads(threads), torch.inference_mode():
            return [_cpu(forward(rows)) for forward in forwards]

    reference = outputs(configured)
    agreeing, differing = [], []
    for count in yield_counts(configured):
        same = all(map(_same, outputs(count), reference))
        (agreeing if same else differing).append(count)
    detail = f"bit-identical to {configured} threads at {agreeing or 'no smaller count'}"
    if differing:
        detail += f"; not at {differing}"
    return agreeing, detail


def core_yield_for(model, configured: int, max_input_tokens: int) -> tuple[CoreYield | None, str]:
    """Yielding cores (sr.worker.contention) for a CPU model served at `configured` threads:
    a CoreYield over the counts `thread_count_probe` allows, or None; and why."""
    cpus = usable_cpus()
    unreadable = host_cpu_unreadable(cpus)
    if unreadable is not None:
        return None, unreadable
    counts, detail = thread_count_probe(model, configured, THREADS.use, max_input_tokens)
    if not counts:
        return None, detail
    policy = YieldPolicy(configured, counts, len(cpus))
    return CoreYield(policy, lambda: host_busy_seconds(cpus)), detail
