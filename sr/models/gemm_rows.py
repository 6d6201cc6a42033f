"""How many rows a matrix multiply needs before its rows stop depending on the row count,
and whether its bits depend on the thread count.

Kernels pick different code for very short matrices: on MKL a row computed in a 3-row
product can differ in the last bit from the same row in a 40-row product, and the cut-off
moves with the thread count (measured: under 4 rows at 1 thread, under 12 at 2, under 28
at 16). Packed forwards shorter than the cut-off are padded up to it, so a text gets the
same bits alone as inside any batch. The cut-off is measured, not assumed: once per
(device, thread count, shape, kernel, dtype), on random data, in a few milliseconds. A row
must match the longer product both at its start and at its end (a row's place in a batch
is arbitrary).

The thread check backs the worker's thread shadows (sr.worker.adaptive), which serve a
batch at one count and must reproduce its bits at another: a product of rows past the
cut-off must give the same bits at 1 thread, at 2 and at the count in force.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import torch

from sr.models import kernels

PROBE_ROWS = 64  # the largest cut-off measured is 28 (16 threads); probe well past it

_lock = threading.Lock()
_cut_offs: dict[tuple, int] = {}

Product = Callable[[torch.Tensor], torch.Tensor]
# One product's shape, kernel and dtype: (in_features, out_features, kernel, dtype).
ProductKey = tuple[int, int, str, torch.dtype]


def _probe_product(
    device: torch.device, in_features: int, out_features: int, kernel: str, dtype: torch.dtype
) -> tuple[torch.Tensor, Product]:
    """PROBE_ROWS random input rows and a random product of the shape on `kernel`."""
    generator = torch.Generator().manual_seed(1234)

    def random(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

    x, w, b = (
        random(PROBE_ROWS, in_features),
        random(out_features, in_features),
        random(out_features),
    )
    weight = kernels.prepare(kernel, w)
    return x, lambda rows: kernels.linear(kernel, rows, weight, b)


def _measure(
    device: torch.device, in_features: int, out_features: int, kernel: str, dtype: torch.dtype
) -> int:
    x, product = _probe_product(device, in_features, out_features, kernel, dtype)
    with torch.inference_mode():
        reference = product(x)
        worst = 0
        for rows in range(1, PROBE_ROWS):
            tail = PROBE_ROWS - rows
            if not (
                torch.equal(product(x[:rows]), reference[:rows])
                and torch.equal(product(x[tail:]), reference[tail:])
            ):
                worst = rows
    return worst + 1


def min_consistent_rows(
    device: torch.device,
    in_features: int,
    out_features: int,
    kernel: str = kernels.BLAS,
    dtype: torch.dtype = torch.float32,
) -> int:
    """Fewest rows at which a product's rows match those of a longer product, at the
    thread count now in force."""
    key = (str(device), torch.get_num_threads(), in_features, out_features, kernel, dtype)
    cut_off = _cut_offs.get(key)
    if cut_off is None:
        with _lock:
            cut_off = _cut_offs.get(key)
            if cut_off is None:
                cut_off = _cut_offs[key] = _measure(
                    device, in_features, out_features, kernel, dtype
                )
    return cut_off


def measure_many(
    device: torch.device,
    keys: Iterable[ProductKey],
    workers: int,
) -> None:
    """Measure the cut-offs of `keys` not yet known at 1 thread, on up to `workers` threads at once.

    For a process at 1 thread (asserted): each product then runs inline on the thread that
    calls it, so the shapes measure side by side on as many cores, and each measures what
    it would alone (one shape's bits never depend on another's run). A host's first start
    measures a model's shapes this way (MiniLM's four: 0.29 s one after another on this
    2-core host). The helper threads are gone when this returns."""
    if torch.get_num_threads() != 1:
        raise RuntimeError("cut-offs are measured side by side only at 1 thread")
    with _lock:
        missing = sorted({key for key in keys if (str(device), 1, *key) not in _cut_offs}, key=str)
    if not missing:
        return

    def measure(key: ProductKey) -> None:
        # A new thread starts at OpenMP's default count (the cores): MKL would then run
        # this product on a team of its own, other bits and threads that outlive it.
        torch.set_num_threads(1)
        rows = _measure(device, *key)
        with _lock:
            _cut_offs.setdefault((str(device), 1, *key), rows)

    threads_before = _os_threads()
    with ThreadPoolExecutor(max(1, min(workers, len(missing)))) as pool:
        for _ in pool.map(measure, missing):
            pass
    # A joined Python thread is still an OS thread for a moment (measured: two helpers
    # still listed right after the join, gone 0.1 s later); a caller about to fork needs
    # them gone.
    deadline = time.monotonic() + _THREADS_EXIT_S
    while _os_threads() > threads_before and time.monotonic() < deadline:
        time.sleep(0.001)


_THREADS_EXIT_S = 1.0


def _os_threads() -> int:
    """This process's OS threads (Linux); 0 where /proc does not list them."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def measured_at(device: torch.device, threads: int) -> dict[ProductKey, int]:
    """The cut-offs known in this process at `device` and `threads`:
    (in_features, out_features, kernel, dtype) -> rows."""
    with _lock:
        return {
            key[2:]: rows
            for key, rows in _cut_offs.items()
            if key[0] == str(device) and key[1] == threads
        }


def adopt(device: torch.device, threads: int, known: dict[ProductKey, int]) -> None:
    """Take `known` (as `measured_at` gives them) as measured: kept from an earlier
    measure of this host (sr.models.probe_cache)."""
    with _lock:
        for (in_features, out_features, kernel, dtype), rows in known.items():
            _cut_offs[(str(device), threads, in_features, out_features, kernel, dtype)] = rows


def threads_agree(
    device: torch.device,
    in_features: int,
    out_features: int,
    kernel: str,
    dtype: torch.dtype = torch.float32,
) -> bool:
    """Does a PROBE_ROWS-row product give the same bits at 1 thread, at 2 and at the
    count in force? (The count in force is restored.)"""
    x, product = _probe_product(device, in_features, out_features, kernel, dtype)
    before = torch.get_num_threads()
    results = []
    try:
        with torch.inference_mode():
            for threads in sorted({1, 2, before}):
                torch.set_num_threads(threads)
                results.append(product(x))
    finally:
        torch.set_num_threads(before)
    return all(torch.equal(results[0], other) for other in results[1:])
