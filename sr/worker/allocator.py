"""glibc malloc for a worker: keep freed activations while busy, give them back when idle.

Why: a big batch's activations are tens of MiB per tensor. glibc serves blocks above its
mmap threshold with fresh mmaps and returns them on free, so every forward of a big batch
page-faults its activations in again: ~40-50k minor faults per forward of 32 medium texts
(MiniLM), 100 ms of kernel time, and on a loaded host 1.4-2x the forward's wall time
(bench_memory `--allocator`). ONNX Runtime's arena does not pay it.

Rules:
* At worker start (`configure_malloc`): blocks up to 32 MiB (glibc's most on 64-bit; a
  [4096, 1536] fp32 activation is 24 MiB) come from the heap, and the heap is trimmed
  only past 256 MiB of free top, so a batch reuses the pages the previous one freed.
* Kept memory is given back when the worker is idle: a daemon thread calls
  `malloc_trim(0)` once the process has used under `IDLE_CPU_S` of CPU for `IDLE_S`
  (its /health probes cost far less), once per idle spell. So a busy worker holds its
  largest batch's working set (which it needs during that batch anyway, with or without
  this), and an idle one holds what it would without this.
* `SR_MALLOC=default` leaves glibc as it is (for measuring; or to rule this out).
* Bit-neutral: where a buffer lives does not change what is computed in it.
* Not glibc (musl: no `gnu_get_libc_version`): nothing is set. With jemalloc or tcmalloc
  preloaded, glibc's mallopt and malloc_trim act on a malloc nobody uses: harmless.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time
from collections.abc import Mapping

ENV = "SR_MALLOC"
M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

MiB = 1 << 20
SETTINGS = {
    M_MMAP_THRESHOLD: 32 * MiB,
    M_TRIM_THRESHOLD: 256 * MiB,
    M_TOP_PAD: 64 * MiB,  # fewer brk calls while a batch's heap grows
}
IDLE_S = 1.0
IDLE_CPU_S = 0.05


def configure_malloc(environ: Mapping[str, str]) -> str:
    """Tune malloc and start the idle trimmer; returns what was done, in words.
    `environ`: the settings' snapshot (sr.settings)."""
    if environ.get(ENV, "") == "default":
        return f"glibc defaults ({ENV}=default)"
    libc = glibc()
    if libc is None:
        return "not glibc: malloc left as it is"
    done = tune_malloc(libc)
    if done == "tuned":
        start_idle_trim(libc)
    return done


def tune_malloc(libc, settings: dict[int, int] | None = None) -> str:
    for option, value in (settings or SETTINGS).items():
        if libc.mallopt(ctypes.c_int(option), ctypes.c_int(value)) != 1:
            return f"mallopt({option}, {value}) refused: malloc left partly tuned"
    return "tuned"


def start_idle_trim(libc, idle_s: float = IDLE_S, idle_cpu_s: float = IDLE_CPU_S):
    thread = threading.Thread(
        target=_trim_when_idle, args=(libc, idle_s, idle_cpu_s), name="sr-malloc-trim", daemon=True
    )
    thread.start()
    return thread


def _trim_when_idle(libc, idle_s: float, idle_cpu_s: float) -> None:
    trimmed = False
    cpu = time.process_time()
    while True:
        time.sleep(idle_s)
        now = time.process_time()
        busy = now - cpu >= idle_cpu_s
        cpu = now
        if busy:
            trimmed = False
        elif not trimmed:
            libc.malloc_trim(ctypes.c_size_t(0))
            trimmed = True
            cpu = time.process_time()  # the trim's own CPU is not work


def glibc():
    """The C library when it is glibc, else None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: musl has no such symbol
    except (OSError, AttributeError, TypeError):
        return None
    return libc
