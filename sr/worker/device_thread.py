"""The one OS thread of a worker process that runs its torch work (a short forward at 1
thread may run on the Trio thread instead: sr.worker.engine's rules).

Why a dedicated long-lived thread instead of `trio.to_thread.run_sync` with a limiter of 1:
trio's thread cache may hand the work to a different OS thread each time, and torch keeps
per-thread state (the OpenMP/intra-op pool is created per calling thread, grad mode, CUDA
current device and stream). One pinned thread means one thread pool, one CUDA context
binding, and a single place where "what is the device doing now" has an answer. Work is
fed through a queue; results come back to Trio through the run's TrioToken.

A caller that is cancelled stops waiting, but the work already queued still runs: a forward
may finish after its caller gave up (admission counts it until then).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import trio

T = TypeVar("T")

_STOP = object()


class DeviceThread:
    def __init__(self, name: str = "sr-device") -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # Work handed over by `run` and not yet finished (a cancelled caller's included),
        # counted on the Trio thread: zero means the thread is idle.
        self.in_flight = 0
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            work, deliver = item
            deliver(outcome.capture(work))

    async def run(self, work: Callable[[], T]) -> T:
        """Run `work()` on the device thread and return (or raise) its outcome."""
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        box: list[outcome.Outcome] = []

        def finished() -> None:
            self.in_flight -= 1
            done.set()

        def deliver(result: outcome.Outcome) -> None:
            box.append(result)
            try:
                token.run_sync_soon(finished)
            except trio.RunFinishedError:
                pass  # the Trio run ended while this work ran; nobody is waiting

        self.in_flight += 1
        self._queue.put((work, deliver))
        await done.wait()
        return box[0].unwrap()

    def stop(self) -> None:
        """Let the thread exit after the work already queued (it is a daemon either way)."""
        self._queue.put(_STOP)
