"""The host's kernel choice kept on disk, so that a later start skips the probe.

The probe (sr.models.linear.choose_kernel) runs a few products at every row count under
PROBE_ROWS and at 1 and 2 threads: about a quarter of a second of every cold start of a
model's fork server, for an answer that only the host can change. The answer is kept per
key: the CPU (its model name and flags, from /proc/cpuinfo), torch's version and the
backends it was built with, the device, dtype and thread count the probe ran at, the
variables torch's native libraries read (OMP_*, MKL_*, DNNL_*, ...), and PROBE_VERSION
(raised whenever the probe's rules change). Any of those differing is
another key, so a kept answer is one the probe would give again.

The short-matrix cut-offs (sr.models.gemm_rows: how many rows a product needs before its
rows stop depending on the row count) are the same kind of answer, measured for each of a
model's product shapes when its fork server loads it: about a quarter of a second of every
start for MiniLM. They are kept in a second file, per probe key and shape and kernel.
A worker's golden check and batching probe are kept in a third (sr.worker.kept_checks says
what its key holds and when a kept entry is used).

Where: sr.settings.host_cache_dir (`$SR_CACHE_DIR`, else `$XDG_CACHE_HOME/sr`, else
`~/.cache/sr`; `SR_CACHE_DIR=off` turns the cache off); one JSON file, replaced atomically.
Best effort: a file that cannot be read or written costs a probe, never a start.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch

PROBE_VERSION = 1
FILE_NAME = "kernel-probe.json"
CUT_OFF_FILE_NAME = "gemm-cut-offs.json"
START_CHECKS_FILE_NAME = "start-checks.json"
_MAX_ENTRIES = 64  # hosts, torch versions and thread counts one home has seen
_MAX_CUT_OFFS = 1024  # a model has 4 to 8 product shapes


def cache_file(folder: Path | None) -> Path | None:
    """The cache file in `folder` (sr.settings.host_cache_dir; None: the cache is off)."""
    return None if folder is None else folder / FILE_NAME


def _cpu_identity() -> str:
    """The first processor's model name and flags (the same on every core of a host)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return "unknown"
    fields = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        name, _, value = line.partition(":")
        fields[name.strip()] = value.strip()
    return f"{fields.get('model name', '')}|{fields.get('flags', fields.get('Features', ''))}"


def probe_key(
    device: torch.device, dtype: torch.dtype, threads: int, native: Mapping[str, str]
) -> str:
    """`native`: the variables torch's libraries read (sr.settings.native_library_variables)."""
    parts = [
        str(PROBE_VERSION), torch.__version__, torch.__config__.show(), _cpu_identity(),
        str(device), str(dtype), str(threads), json.dumps(dict(native), sort_keys=True),
    ]  # fmt: skip
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def load(path: Path | None, key: str) -> dict[str, str] | None:
    """The choice kept under `key` ({"linear", "reason"}), or None."""
    entry = _entries(path).get(key)
    if isinstance(entry, dict) and all(isinstance(entry.get(k), str) for k in ("linear", "reason")):
        return {"linear": entry["linear"], "reason": entry["reason"]}
    return None


def store(path: Path | None, key: str, choice: Mapping[str, str]) -> None:
    """Keep `choice` under `key` (the file replaced atomically); errors are ignored."""
    entry = {"linear": choice["linear"], "reason": choice["reason"]}
    _replace_entries(path, {key: entry}, _MAX_ENTRIES)


def cut_off_file(folder: Path | None) -> Path | None:
    """The file of measured cut-offs in `folder` (None: the cache is off)."""
    return None if folder is None else folder / CUT_OFF_FILE_NAME


def cut_off_key(base: str, in_features: int, out_features: int, kernel: str) -> str:
    """One product shape's key under `base`, a `probe_key` (the host, dtype and threads)."""
    return f"{base}:{in_features}x{out_features}:{kernel}"


def load_cut_offs(path: Path | None, base: str) -> dict[tuple[int, int, str], int]:
    """The cut-offs kept under `base` (a `probe_key`): (in, out, kernel) -> rows."""
    kept = {}
    for key, rows in _entries(path).items():
        head, _, shape_and_kernel = key.partition(":")
        shape, _, kernel = shape_and_kernel.partition(":")
        in_features, _, out_features = shape.partition("x")
        if (
            head == base
            and in_features.isdigit()
            and out_features.isdigit()
            and isinstance(rows, int)
            and not isinstance(rows, bool)
        ):
            kept[(int(in_features), int(out_features), kernel)] = rows
    return kept


def store_cut_offs(path: Path | None, cut_offs: Mapping[str, int]) -> None:
    """Keep `cut_offs` (key -> rows), the file replaced atomically; errors are ignored."""
    _replace_entries(path, dict(cut_offs), _MAX_CUT_OFFS)


def start_checks_file(folder: Path | None) -> Path | None:
    """The file of kept start checks in `folder` (None: the cache is off)."""
    return None if folder is None else folder / START_CHECKS_FILE_NAME


def load_entry(path: Path | None, key: str) -> dict | None:
    """The object kept under `key` in `path`, or None."""
    entry = _entries(path).get(key)
    return entry if isinstance(entry, dict) else None


def store_entry(path: Path | None, key: str, entry: dict, most: int) -> None:
    """Keep `entry` under `key` (at most `most` entries, the oldest dropped; the file
    replaced atomically); errors are ignored."""
    _replace_entries(path, {key: entry}, most)


def _replace_entries(path: Path | None, new: dict[str, object], most: int) -> None:
    """`path`'s entries with `new` added last (the oldest dropped past `most`), written to a
    temporary file and renamed over it; a damaged file is started afresh."""
    if path is None or not new:
        return
    entries = _entries(path)
    try:
        for key in new:
            entries.pop(key, None)
        while entries and len(entries) + len(new) > most:
            entries.pop(next(iter(entries)))
        entries.update(new)
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as out:
            try:
                json.dump(entries, out)
            except BaseException:
                os.unlink(out.name)
                raise
        os.replace(out.name, path)
    except OSError:
        return


def _entries(path: Path | None) -> dict:
    """`path`'s entries; none where the cache is off or the file missing or damaged."""
    if path is None:
        return {}
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}
