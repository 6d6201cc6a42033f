"""Fakes shared by the thread tests: a hand-driven clock and forwards that cost time."""

from __future__ import annotations

from collections.abc import Callable

import torch


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class CostedForward:
    """A forward whose duration depends on the thread count in force when it runs.

    Every call is logged as (threads, result) so tests can see which runs happened and which
    result object the runner returned. `drift(threads)` may change the bits at some counts.
    """

    def __init__(
        self,
        clock: FakeClock,
        cost_ms: Callable[[int], float] | dict[int, float],
        *,
        drift: Callable[[int], bool] = lambda threads: False,
    ) -> None:
        self.clock = clock
        self.cost_ms = cost_ms if callable(cost_ms) else cost_ms.__getitem__
        self.drift = drift
        self.calls: list[tuple[int, torch.Tensor]] = []

    def __call__(self) -> torch.Tensor:
        threads = torch.get_num_threads()
        self.clock.now += self.cost_ms(threads) / 1000.0
        out = torch.linspace(-1.0, 1.0, 8, dtype=torch.float32)
        if self.drift(threads):
            # The smallest possible change: one ulp in one element.
            out[3] = torch.nextafter(out[3], torch.tensor(2.0))
        self.calls.append((threads, out))
        return out

    def counts(self) -> list[int]:
        return [threads for threads, _ in self.calls]

    def produced_at(self, result: torch.Tensor) -> int:
        """The thread count of the run that produced exactly this result object."""
        for threads, out in self.calls:
            if out is result:
                return threads
        raise AssertionError("result was not produced by this forward")
