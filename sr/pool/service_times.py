"""ServiceTimes: how long a healthy replica of one deployment takes, by request size (pure).

It answers one question for the pool: when a caller's own deadline fires, was that
deadline one a healthy replica could have met? Only then does the firing count against
the replica (a `timeout`: backoff, and a step towards ejection). A deadline shorter than
the deployment's observed healthy service time for that size, or shorter than
`outlier_detection.min_deadline_ms`, still cancels the request and answers 504, but says
nothing about the replica: otherwise any caller could eject every replica by sending
deadlines no replica could meet. The deployment's own `timeout_ms` always counts.

The estimate per size bucket (request bytes, by powers of two) tracks a high quantile of
the `ok` exchanges' durations (dispatch to answer read, queueing in the worker included):
it rises a quarter of the way towards a slower answer and decays a hundredth of the way
towards a faster one, which settles near the 96th percentile (where the two pulls balance:
0.25 x 0.04 = 0.01 x 0.96), follows a slowdown within a few answers and forgets one slowly.
Answers that take longer under load therefore raise the bar with the load. A bucket with
no answer yet borrows the largest estimate of the smaller buckets (a larger request is
never faster), else nothing but the floor applies.
"""

from __future__ import annotations

_RISE = 0.25
_DECAY = 0.01
_BUCKETS = 40  # 2**40 bytes: far beyond any body cap


class ServiceTimes:
    __slots__ = ("_estimate_s",)

    def __init__(self) -> None:
        self._estimate_s = [0.0] * _BUCKETS

    def observe(self, nbytes: int, seconds: float) -> None:
        """One `ok` exchange of `nbytes` request bytes took `seconds`."""
        bucket = min(nbytes.bit_length(), _BUCKETS - 1)
        current = self._estimate_s[bucket]
        if current == 0.0:
            self._estimate_s[bucket] = seconds
        elif seconds > current:
            self._estimate_s[bucket] = current + (seconds - current) * _RISE
        else:
            self._estimate_s[bucket] = current - (current - seconds) * _DECAY

    def healthy_s(self, nbytes: int) -> float:
        """The service time a healthy replica needs for a request of `nbytes` (0.0 while
        nothing of that size or smaller has been answered)."""
        bucket = min(nbytes.bit_length(), _BUCKETS - 1)
        estimate = self._estimate_s[bucket]
        if estimate == 0.0:
            estimate = max(self._estimate_s[:bucket], default=0.0)
        return estimate

    def deadline_counts(self, nbytes: int, budget_s: float, floor_s: float) -> bool:
        """Does a caller's deadline of `budget_s` (from dispatch) that fired count against
        the replica? Only one at least the floor and the healthy service time does."""
        return budget_s >= floor_s and budget_s >= self.healthy_s(nbytes)
