"""A worker's golden check and batching probe, kept per host for its next start.

Both measure what only the host, sr's code and the weights decide, and they are most of a
warm-up (MiniLM on a 2-core host at 1 thread: the check's two runs of the golden inputs
0.23 s, the probe's seven forwards 0.16 s, of 0.4 s). A start whose key was kept runs the
golden inputs once, on the model it loaded, and compares the digest of their token ids and
answers (sr.models.golden.outputs_digest) with the one kept:

* the same: this instance answers the golden inputs with the bits of an earlier one that
  passed the whole check (its reruns bit-identical, its answers within the reference's
  bound), so both of that start's results stand, and the card says they were kept;
* another, or nothing kept: the check (reusing this first run) and the probe run in full,
  and a pass is kept.

A failed check is never kept. Kept only for CPU workers at one fixed thread count (an
adaptive runner chooses its counts as it learns), with sr's own loader and check.

The key: the host's probe key (CPU model and flags, torch's version and build, device,
dtype, thread count, the native libraries' variables: sr.models.probe_cache), the weights'
digest, the input cap (the probe's rows are cut to it), the kernel and engine serving the
backbone, sr's own code (the size and mtime of each of its source files), and KEPT_VERSION,
raised whenever the checks' rules change.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import torch

import sr
from sr.models import probe_cache
from sr.models.golden import (
    GoldenResult,
    golden_check,
    golden_outputs,
    golden_token_ids,
    outputs_digest,
    weights_digest_beside,
)
from sr.settings import native_library_variables
from sr.worker.warmup import ProbeResult, batch_invariance_probe

KEPT_VERSION = 1
_MAX_ENTRIES = 256  # models, dtypes and thread counts one home has served
_KEPT_CHECK = "; kept from an earlier start, whose golden answers this start's match bit for bit"
_KEPT_PROBE = " (probed at an earlier start)"


def start_checks(
    model,
    runner,
    max_input_tokens: int,
    kept_file: Path | None,
    check: Callable[[Any], GoldenResult] = golden_check,
) -> tuple[GoldenResult, ProbeResult | None]:
    """The golden check and, when it passes, the batching probe (None when it fails), on
    the device thread. `kept_file`: sr.models.probe_cache.start_checks_file, or None to
    run both in full. `check`: the golden check (sr.models.golden.golden_check; with a
    kept file it is handed the first run of the golden inputs as `first`)."""
    if kept_file is None:
        return _in_full(model, runner, max_input_tokens, check)
    try:
        ids = golden_token_ids(model)
        with weights_digest_beside(model) as weights:
            first = runner.run(lambda: golden_outputs(model, ids), 0)
            key = check_key(model, runner.threads, max_input_tokens, weights())
        answers = outputs_digest(ids, first)
    except Exception:  # the check in full says what failed
        return _in_full(model, runner, max_input_tokens, check)
    kept = _kept(probe_cache.load_entry(kept_file, key), answers)
    if kept is not None:
        return kept
    golden, probe = _in_full(model, runner, max_input_tokens, functools.partial(check, first=first))
    if probe is not None:
        entry = {"answers": answers, "golden": attrs.asdict(golden), "probe": probe.card()}
        probe_cache.store_entry(kept_file, key, entry, _MAX_ENTRIES)
    return golden, probe


def _in_full(
    model, runner, max_input_tokens: int, check
) -> tuple[GoldenResult, ProbeResult | None]:
    golden = runner.run(lambda: check(model), 0)
    if golden.status != "passed":
        return golden, None
    return golden, batch_invariance_probe(model, runner, max_input_tokens)


def check_key(model, threads: int, max_input_tokens: int, weights_sha256: str) -> str:
    """What a kept entry is kept under (see the module's rules)."""
    dtype = getattr(model, "dtype", torch.float32)
    host = probe_cache.probe_key(model.device, dtype, threads, native_library_variables())
    kernel = (getattr(model, "kernel_card", None) or {}).get("linear")
    engine = getattr(model, "engine_card", None) or {}
    serving = {key: engine.get(key) for key in ("name", "version", "graph")}
    parts = [
        str(KEPT_VERSION), host, weights_sha256, str(max_input_tokens), str(kernel),
        json.dumps(serving, sort_keys=True, default=str), source_identity(),
    ]  # fmt: skip
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


@functools.cache
def source_identity() -> str:
    """The digest of every sr source file's path, size and mtime: another tree, or an edit,
    is another key (2-3 ms on the 2-core host, once per process)."""
    root = Path(sr.__file__).parent
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                stat = os.stat(path)
                digest.update(f"{path}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _kept(entry: dict | None, answers: str) -> tuple[GoldenResult, ProbeResult] | None:
    """The kept results when `entry` holds a pass for these answers; None otherwise (no
    entry, other answers, or an entry this version cannot read)."""
    if entry is None or entry.get("answers") != answers:
        return None
    golden, probe = entry.get("golden"), entry.get("probe")
    try:
        fields = {**golden, "reason": golden["reason"] + _KEPT_CHECK}
        result = GoldenResult(**fields)
        kept_probe = ProbeResult(bool(probe["passed"]), probe["detail"] + _KEPT_PROBE)
    except (TypeError, KeyError):
        return None
    return (result, kept_probe) if result.passed else None
