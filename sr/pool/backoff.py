"""Backoff rules, pure: they take `now` and return times.

* Request backoff: a `failed` or `timeout` outcome takes the replica out of dispatch for
  0.1 s, doubling per consecutive bad outcome up to 3.2 s; an `ok` clears it.
* Restart backoff: a managed worker that exits is restarted after 1 s, doubling to 60 s;
  the delay resets once the worker has run healthy (ready, without a break) for 2 minutes.
  Time spent out of READY (unreachable, loading again, ...) never counts as healthy.

Every capped doubling in the pool is `capped_doubling`: these two backoffs, the outlier
ejection's duration (sr.pool.ejection) and the retry after a failed discovery resolution
(sr.pool.membership).
"""

from __future__ import annotations

from typing import TypeVar

REQUEST_BACKOFF_BASE_S = 0.1
REQUEST_BACKOFF_MAX_S = 3.2
RESTART_BACKOFF_BASE_S = 1.0
RESTART_BACKOFF_MAX_S = 60.0
RESTART_RESET_AFTER_HEALTHY_S = 120.0


Number = TypeVar("Number", int, float)


def capped_doubling(base: Number, cap: Number, step: int) -> Number:
    """base * 2**step, capped; step 0 is the first delay (ints stay ints: milliseconds)."""
    if step >= 32:  # 2**32 * any sane base is past any cap; avoid huge floats
        return cap
    return min(base * (1 << step), cap)


class RequestBackoff:
    def __init__(self) -> None:
        self.consecutive_bad = 0
        self.until = float("-inf")

    def bad_outcome(self, now: float) -> float:
        """Record a failed/timeout outcome; returns the backoff delay applied."""
        delay = capped_doubling(REQUEST_BACKOFF_BASE_S, REQUEST_BACKOFF_MAX_S, self.consecutive_bad)
        self.consecutive_bad += 1
        self.until = now + delay
        return delay

    def ok(self) -> None:
        self.consecutive_bad = 0
        self.until = float("-inf")


class RestartBackoff:
    def __init__(self) -> None:
        self.step = 0
        self.restarts = 0
        self.healthy_since: float | None = None  # start of the current READY stretch
        self.was_ready = False  # this incarnation became ready at least once

    def became_ready(self, now: float) -> None:
        self.was_ready = True
        if self.healthy_since is None:
            self.healthy_since = now

    def left_ready(self, now: float) -> None:
        """The replica left READY at `now`: its healthy stretch ends here."""
        self._end_stretch(now)

    def exited(self, now: float) -> float:
        """The worker exited at `now`; returns how long to wait before starting it again."""
        self._end_stretch(now)
        self.was_ready = False
        delay = capped_doubling(RESTART_BACKOFF_BASE_S, RESTART_BACKOFF_MAX_S, self.step)
        self.step += 1
        self.restarts += 1
        return delay

    def _end_stretch(self, now: float) -> None:
        if (
            self.healthy_since is not None
            and now - self.healthy_since >= RESTART_RESET_AFTER_HEALTHY_S
        ):
            self.step = 0
        self.healthy_since = None
