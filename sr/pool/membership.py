"""Discovered membership, as pure policy: which addresses join or leave, and when to resolve.

Envoy's STRICT_DNS cluster is the model (sr.pool.discovery does the I/O):

* identity is the address and port: a resolution that returns the same set, in any order
  and with repeats, changes nothing (`diff_membership`);
* an address that appears joins (after its health and card checks, which the I/O side
  waits for); one that disappears leaves (is drained);
* a failed resolution (an error, a timeout, or no address at all) changes nothing: the
  last good set stays, and the failure is recorded for the inventory;
* `ResolutionSchedule` says when to resolve next: `refresh_s` after a success; after a
  failed resolution, again after 1 s, doubling up to `refresh_s`; a replica's failure
  brings the next resolution forward to "now"; never more often than once per
  `MIN_INTERVAL_S`. Times are the caller's clock (trio.current_time()), passed in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import attrs

from sr.pool.backoff import capped_doubling

Address = tuple[str, int]

MIN_INTERVAL_S = 1.0


def address_text(address: Address) -> str:
    """host:port, with an IPv6 host in brackets."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@attrs.frozen
class MembershipDiff:
    joining: tuple[Address, ...]
    leaving: tuple[Address, ...]
    staying: tuple[Address, ...]

    @property
    def unchanged(self) -> bool:
        return not self.joining and not self.leaving


def diff_membership(current: Iterable[Address], resolved: Iterable[Address]) -> MembershipDiff:
    """What a resolution changes: addresses (sorted) that join, leave and stay."""
    known = set(current)
    answer = set(resolved)
    return MembershipDiff(
        joining=tuple(sorted(answer - known)),
        leaving=tuple(sorted(known - answer)),
        staying=tuple(sorted(known & answer)),
    )


@attrs.frozen
class Resolution:
    """One resolution's outcome, for the inventory: when (wall clock, seconds since the
    epoch, and the caller's clock), how many addresses, and the error if it failed."""

    at: float  # the caller's clock (trio.current_time())
    wall_time: float  # time.time()
    count: int
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@attrs.define
class ResolutionSchedule:
    refresh_s: float
    min_interval_s: float = MIN_INTERVAL_S
    last_attempt: float = -math.inf
    due_at: float = -math.inf  # the first resolution is due at once
    consecutive_failures: int = 0

    def resolved(self, now: float, *, ok: bool) -> None:
        """A resolution finished at `now`."""
        self.last_attempt = now
        if ok:
            self.consecutive_failures = 0
            self.due_at = now + self.refresh_s
        else:
            self.consecutive_failures += 1
            cap = max(self.refresh_s, self.min_interval_s)
            step = self.consecutive_failures - 1
            self.due_at = now + capped_doubling(self.min_interval_s, cap, step)

    def replica_failed(self, now: float) -> None:
        """A member failed: resolve again soon (the set may have moved), but bounded."""
        self.due_at = min(self.due_at, max(now, self.last_attempt + self.min_interval_s))

    def set_refresh(self, refresh_s: float) -> None:
        """A reload changed `refresh_s`: the next resolution follows the new period."""
        if self.last_attempt > -math.inf and self.consecutive_failures == 0:
            self.due_at = self.last_attempt + refresh_s
        self.refresh_s = refresh_s

    def next_due(self) -> float:
        """When the next resolution may run (never before min_interval_s after the last)."""
        return max(self.due_at, self.last_attempt + self.min_interval_s)

    def is_due(self, now: float) -> bool:
        return now >= self.next_due()
