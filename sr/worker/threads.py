"""Per-process thread context: every forward declares its torch thread count.

torch's intra-op thread count is process-global, so two workers (or models) in one process
would otherwise inherit each other's setting. Each forward runs inside
`THREADS.use(n)`, which applies `n` only when it differs from what is in force.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch


class ThreadContext:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._applied: int | None = None
        self.set_calls = 0  # how often torch.set_num_threads actually ran

    @contextlib.contextmanager
    def use(self, threads: int) -> Iterator[None]:
        if threads < 1:
            raise ValueError(f"thread count must be >= 1, got {threads}")
        with self._lock:
            if self._applied != threads:
                torch.set_num_threads(threads)
                self._applied = threads
                self.set_calls += 1
            yield


THREADS = ThreadContext()


class ForwardRunner:
    """Runs every forward of one worker at its thread count, on the device thread.

    The engine calls `run(forward, padded_tokens)` for each batch and `unlock()` once the
    golden check has passed. Adaptive learning (VLLM_SRUN_CPU_ADAPTIVE_THREADS) extends
    this class; with learning off it simply runs at the configured count.
    """

    def __init__(self, threads: int, *, context: ThreadContext = THREADS) -> None:
        self.threads = threads
        self._context = context

    def unlock(self) -> None:
        """The golden check passed: exploration may start."""

    def run(self, forward, padded_tokens: int):
        with self._context.use(self.threads):
            return forward()

    def report(self) -> dict:
        return {"mode": 0, "status": "off", "configured_threads": self.threads}
