"""CPU threads: the per-process thread context, and the forward runner.

torch's intra-op thread count is process-global, so two workers (or models) in one process
would otherwise inherit each other's setting. Each forward runs inside `THREADS.use(n)`,
which applies `n` only when it differs from what is in force and holds the context for the
whole forward, so forwards at different counts never overlap.

`ForwardRunner` is the engine's seam: every batch goes through `run(forward, padded_tokens)`
on the device thread. With VLLM_SRUN_CPU_ADAPTIVE_THREADS it also learns, per input-size
bucket, which thread count is fastest (policy in `sr.worker.adaptive`), without ever
serving an answer that differs from the configured count's. Without it, a runner allowed
to yield (`allow_yielding`, sr.worker.contention) runs a forward at fewer threads while
other work holds the cores, at counts checked to give the configured count's bits. A
runner given a placement (`place_peers`, sr.worker.placement) keeps the OpenMP peers of
every forward at 2 or more threads off the device thread's CPU.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import torch

from sr.devices import cpu_budget
from sr.events import EventSink
from sr.worker.adaptive import (
    DEFAULT_SETTINGS,
    LearningSettings,
    Outcome,
    Step,
    ThreadLearner,
    allowed_thread_counts,
)
from sr.worker.contention import CoreYield
from sr.worker.placement import PeerPlacement

T = TypeVar("T")


class ThreadContext:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.set_calls = 0  # how often torch.set_num_threads actually ran

    @contextlib.contextmanager
    def use(self, threads: int) -> Iterator[None]:
        with self._lock:
            self._set(threads)
            yield

    def call(self, threads: int, fn: Callable[[], T], before: Callable[[], Any] | None = None) -> T:
        """`before()` then `fn()` inside `use(threads)`, without a generator's enter and
        exit: every forward comes through here."""
        with self._lock:
            self._set(threads)
            if before is not None:
                before()
            return fn()

    def _set(self, threads: int) -> None:
        """torch's thread count made `threads`; called with the lock held."""
        if threads < 1:
            raise ValueError(f"thread count must be >= 1, got {threads}")
        # Compare with torch itself, not a cached value: code outside the context (a
        # library, a test) may have changed the count behind our back.
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
            self.set_calls += 1


THREADS = ThreadContext()


def bit_identical(a: Any, b: Any) -> bool:
    """True when two results have the same dtype, shape and bytes (NaN and -0.0 included)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
            return False
        if a.dtype.is_floating_point or a.dtype.is_complex:
            a, b = _as_bits(a), _as_bits(b)
        return torch.equal(a, b)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(bit_identical(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(bit_identical(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _as_bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


class ForwardRunner:
    """Runs every forward of one worker at its thread count, on the device thread.

    mode 0: always the configured count. mode 1/2: adaptive learning (see
    `sr.worker.adaptive`); `budget` bounds the counts explored (default: this process's
    CPU budget, `sr.devices.cpu_budget()`). The engine calls `unlock()` once the golden
    check has passed.
    """

    def __init__(
        self,
        threads: int,
        *,
        mode: int = 0,
        budget: int | None = None,
        settings: LearningSettings = DEFAULT_SETTINGS,
        context: ThreadContext = THREADS,
        events: EventSink | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if threads < 1:
            raise ValueError(f"thread count must be >= 1, got {threads}")
        if mode not in (0, 1, 2):
            raise ValueError(f"adaptive mode must be 0, 1 or 2, got {mode}")
        self.threads = threads
        self.mode = mode
        self._context = context
        self._events = events if events is not None else EventSink()
        self._clock = clock
        self._state_lock = threading.Lock()  # report() comes from another thread
        self._learner: ThreadLearner | None = None
        self._yield: CoreYield | None = None
        self._placement: PeerPlacement | None = None
        if mode:
            if budget is None:
                budget = cpu_budget()
            self._learner = ThreadLearner(
                threads, allowed_thread_counts(threads, budget), mode=mode, settings=settings
            )

    @property
    def single_threaded(self) -> bool:
        """Every forward at 1 thread: inline on whichever thread calls, with no OpenMP team
        of that thread's own and nothing learned (the engine may then run a short one
        on its caller's thread)."""
        return self.threads == 1 and self._learner is None

    def allow_yielding(self, core_yield: CoreYield) -> None:
        """Serve below the configured count while other work holds the cores (mode 0 only:
        the learner chooses counts in the other modes)."""
        if self._learner is not None:
            raise ValueError("yielding is for adaptive mode 0")
        self._yield = core_yield

    @property
    def yielding(self) -> CoreYield | None:
        return self._yield

    def place_peers(self, placement: PeerPlacement) -> None:
        """Keep the OpenMP peers of forwards at 2 or more threads off the device thread's
        CPU (found for this runner's device thread: call on it)."""
        self._placement = placement

    @property
    def placement(self) -> PeerPlacement | None:
        return self._placement

    @contextlib.contextmanager
    def _at(self, threads: int) -> Iterator[None]:
        """The thread context of one forward, its peers placed."""
        with self._context.use(threads):
            if threads > 1 and self._placement is not None:
                self._placement.before_forward()
            yield

    def unlock(self) -> None:
        """The golden check passed: warm-up and exploration may start."""
        if self._learner is not None:
            with self._state_lock:
                self._learner.unlock()

    @property
    def thread_counts(self) -> tuple[int, ...]:
        """Every count this runner may run a forward at."""
        return tuple(self._learner.allowed) if self._learner is not None else (self.threads,)

    def at_each_count(self, fn: Callable[[], Any]) -> None:
        """Run `fn` once, untimed, at every count this runner may use: per-count caches
        (the model's BLAS cut-off) are filled before any timing, not in a timed shadow."""
        for threads in self.thread_counts:
            with self._at(threads):
                fn()

    def run(self, forward: Callable[[], Any], padded_tokens: int) -> Any:
        learner = self._learner
        if learner is None:
            # One thread context per forward, entered as a plain call (`_at` is two
            # generator-based context managers).
            threads = self.threads if self._yield is None else self._yield.threads()
            placement = self._placement if threads > 1 else None
            before = None if placement is None else placement.before_forward
            return self._context.call(threads, forward, before)
        with self._state_lock:
            step = learner.plan(padded_tokens)
        result, outcome = self._execute(step, forward)
        with self._state_lock:
            events = learner.record(step, padded_tokens, outcome)
        for event in events:
            self._events.emit(event.name, **event.fields)
        return result

    def report(self) -> dict:
        if self._learner is None:
            return {"mode": 0, "status": "off", "configured_threads": self.threads}
        with self._state_lock:
            return self._learner.report()

    # -- execution -------------------------------------------------------------------------

    def _timed(self, threads: int, forward: Callable[[], Any]) -> tuple[Any, float]:
        with self._at(threads):
            start = self._clock()
            result = forward()
            return result, (self._clock() - start) * 1000.0

    def _execute(self, step: Step, forward: Callable[[], Any]) -> tuple[Any, Outcome]:
        if step.kind in ("plain", "warmup"):
            with self._at(step.serve):
                return forward(), Outcome()
        if step.kind == "verify":
            # Mode 2 window: the configured answer is computed first so that a drifting or
            # failing learned count can always fall back to it.
            assert step.shadow is not None
            configured, _ = self._timed(step.shadow, forward)
            try:
                learned, _ = self._timed(step.serve, forward)
            except Exception as exc:
                return configured, Outcome(error=_describe(exc))
            if bit_identical(learned, configured):
                return learned, Outcome()
            return configured, Outcome(identical=False)
        return self._explore(step, forward)

    def _explore(self, step: Step, forward: Callable[[], Any]) -> tuple[Any, Outcome]:
        assert step.shadow is not None
        shadow: tuple[Any, float] | None = None
        error: str | None = None

        def run_shadow() -> None:
            nonlocal shadow, error
            try:
                shadow = self._timed(step.shadow, forward)
            except Exception as exc:
                error = _describe(exc)

        if step.shadow_first:
            run_shadow()
        served, served_ms = self._timed(step.serve, forward)
        if not step.shadow_first:
            run_shadow()
        if shadow is None:
            return served, Outcome(error=error)
        shadow_result, shadow_ms = shadow
        return served, Outcome(
            identical=bit_identical(served, shadow_result),
            served_ms=served_ms,
            shadow_ms=shadow_ms,
        )


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]
