"""Pure batch planning: which queued rows share a forward.

Rows are sorted by token length so that each forward pads as little as possible, then cut
greedily into batches of at most `max_num_seqs` rows and `max_num_batched_tokens` padded
tokens (rows x longest row). A single row longer than the token budget still runs, alone:
the worker's options guarantee the budget is at least `max_input_tokens`, so that only
happens when a caller configured it so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import attrs

R = TypeVar("R")


@attrs.frozen
class Limits:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_input_tokens: int
    source: str  # configured | cpu_default | calibrated

    def card(self) -> dict:
        return {
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_input_tokens": self.max_input_tokens,
            "source": self.source,
        }


def plan_batches(
    rows: Sequence[R],
    length: Callable[[R], int],
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
) -> list[list[R]]:
    batches: list[list[R]] = []
    current: list[R] = []
    for row in sorted(rows, key=length):  # stable: equal lengths keep arrival order
        longest = length(row)  # ascending order: the newcomer is the longest row
        grown = len(current) + 1
        if current and (grown > max_num_seqs or grown * longest > max_num_batched_tokens):
            batches.append(current)
            current = []
        current.append(row)
    if current:
        batches.append(current)
    return batches


def padded_tokens(lengths: Sequence[int]) -> int:
    return len(lengths) * max(lengths, default=0)
