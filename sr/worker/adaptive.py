"""Adaptive thread learning: the pure policy (no torch, no clock, no I/O).

Rules, all in one place:

- Locked until `unlock()` (the startup golden check passed). Locked batches run plainly at
  the configured count.
- The first batch of each input-size bucket after unlock is a warm-up: served at the
  configured count, untimed, no shadow, so first-touch caching stays out of the comparison.
- Exploring (mode 1 and 2): each later batch of an unlearned bucket is served at the
  configured count and ONE other allowed count runs it as a timed shadow (the count with the
  fewest samples in that bucket). The shadow must reproduce the served result bit for bit.
- A bucket is learned once every allowed count has `min_samples` timings in it: the count
  with the lowest median wins (ties: the configured count, then the smaller count).
- Exploration is bounded: after `max_shadows` shadows no new shadow runs ("learning uses the
  first requests"); the table is final and status is `learned`.
- Mode 2 only: a learned count L other than the configured C serves its bucket for the next
  `window` batches only while each one, also run at C, is bit-identical; then L serves alone.
- Any bit difference (or a shadow that raises) stops learning for good: status `stopped`,
  every later batch is served at the configured count.

Buckets are floor(log2(padded tokens)): bucket 6 holds 64-127 padded tokens.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any, Literal

import attrs

StepKind = Literal["plain", "warmup", "explore", "verify"]

# Counts above this are only allowed when configured explicitly (VLLM_SRUN_CPU_THREADS).
MAX_EXPLORED_THREADS = 16


@attrs.frozen
class LearningSettings:
    min_samples: int = attrs.field(default=5, validator=attrs.validators.ge(1))
    # None: enough shadows to learn 8 buckets (min_samples x other counts x 8).
    max_shadows: int | None = None
    window: int = attrs.field(default=20, validator=attrs.validators.ge(0))


DEFAULT_SETTINGS = LearningSettings()


@attrs.frozen
class Step:
    """What the runner does with one batch."""

    kind: StepKind
    bucket: int
    serve: int  # the thread count whose result is returned
    shadow: int | None = None  # the count run alongside and compared bit for bit
    shadow_first: bool = False  # alternate the order so neither run always gets a warm cache


@attrs.frozen
class Outcome:
    identical: bool = True
    served_ms: float | None = None
    shadow_ms: float | None = None
    error: str | None = None  # the shadow raised: this text says what


@attrs.frozen
class Event:
    name: str
    fields: dict[str, Any]


def allowed_thread_counts(configured: int, budget: int) -> tuple[int, ...]:
    """Powers of two up to the budget (and at most 16), plus the configured count."""
    if configured < 1 or budget < 1:
        raise ValueError(f"thread counts must be >= 1 (configured={configured}, budget={budget})")
    ceiling = min(budget, MAX_EXPLORED_THREADS)
    counts = {configured}
    power = 1
    while power <= ceiling:
        counts.add(power)
        power *= 2
    return tuple(sorted(counts))


def size_bucket(padded_tokens: int) -> int:
    return max(1, int(padded_tokens)).bit_length() - 1


def bucket_label(bucket: int) -> str:
    return f"{1 << bucket}-{(1 << (bucket + 1)) - 1}"


@attrs.define
class BucketState:
    warmed: bool = False
    batches: int = 0
    tokens: int = 0
    explore_steps: int = 0
    samples_ms: dict[int, list[float]] = attrs.Factory(dict)
    learned: int | None = None
    window_left: int = 0


class ThreadLearner:
    def __init__(
        self,
        configured: int,
        allowed: Iterable[int],
        *,
        mode: int,
        settings: LearningSettings = DEFAULT_SETTINGS,
    ) -> None:
        if mode not in (1, 2):
            raise ValueError(f"learning mode must be 1 or 2, got {mode}")
        self.configured = configured
        self.allowed = tuple(sorted(set(allowed) | {configured}))
        self.mode = mode
        self.settings = settings
        others = len(self.allowed) - 1
        self.max_shadows = (
            settings.max_shadows
            if settings.max_shadows is not None
            else settings.min_samples * others * 8
        )
        self.unlocked = False
        self.shadows = 0
        self.buckets: dict[int, BucketState] = {}
        self.stopped_reason: str | None = None
        if others == 0:
            self.stopped_reason = f"nothing to learn: {configured} is the only allowed thread count"

    # -- state -----------------------------------------------------------------------------

    def unlock(self) -> None:
        self.unlocked = True

    @property
    def exploring(self) -> bool:
        return self.stopped_reason is None and self.shadows < self.max_shadows

    def status(self) -> str:
        if self.stopped_reason is not None:
            return "stopped"
        if not self.unlocked:
            return "locked"
        if not self.exploring:
            return "learned"
        if self.shadows == 0:
            return "warming"
        return "learning"

    def reason(self) -> str | None:
        status = self.status()
        if status == "stopped":
            return self.stopped_reason
        if status == "locked":
            return "waiting for the golden check"
        if status == "learned":
            learned = sum(1 for b in self.buckets.values() if b.learned is not None)
            return (
                f"shadow budget of {self.max_shadows} spent; "
                f"{learned} of {len(self.buckets)} buckets learned"
            )
        return None

    # -- planning (no mutation) ------------------------------------------------------------

    def plan(self, padded_tokens: int) -> Step:
        bucket = size_bucket(padded_tokens)
        plain = Step("plain", bucket, self.configured)
        if not self.unlocked or self.stopped_reason is not None:
            return plain
        state = self.buckets.get(bucket)
        if state is None or not state.warmed:
            return Step("warmup", bucket, self.configured)
        if state.learned is not None:
            if self.mode == 2 and state.learned != self.configured:
                if state.window_left > 0:
                    return Step("verify", bucket, state.learned, shadow=self.configured)
                return Step("plain", bucket, state.learned)
            return plain
        if not self.exploring:
            return plain
        shadow = min(
            (c for c in self.allowed if c != self.configured),
            key=lambda c: (len(state.samples_ms.get(c, ())), c),
        )
        return Step(
            "explore",
            bucket,
            self.configured,
            shadow=shadow,
            shadow_first=state.explore_steps % 2 == 1,
        )

    # -- recording -------------------------------------------------------------------------

    def record(self, step: Step, padded_tokens: int, outcome: Outcome | None = None) -> list[Event]:
        if not self.unlocked:
            return []
        outcome = outcome if outcome is not None else Outcome()
        state = self.buckets.setdefault(step.bucket, BucketState())
        state.batches += 1
        state.tokens += int(padded_tokens)
        if step.kind == "warmup":
            state.warmed = True
            return []
        if step.kind not in ("explore", "verify"):
            return []
        if step.kind == "explore":
            self.shadows += 1
            state.explore_steps += 1
        if outcome.error is not None or not outcome.identical:
            return [self._stop(step, outcome)]
        if step.kind == "verify":
            state.window_left = max(0, state.window_left - 1)
            return []
        assert step.shadow is not None and outcome.served_ms is not None
        assert outcome.shadow_ms is not None
        state.samples_ms.setdefault(step.serve, []).append(outcome.served_ms)
        state.samples_ms.setdefault(step.shadow, []).append(outcome.shadow_ms)
        return self._maybe_learn(step.bucket, state)

    def _maybe_learn(self, bucket: int, state: BucketState) -> list[Event]:
        k = self.settings.min_samples
        if any(len(state.samples_ms.get(c, ())) < k for c in self.allowed):
            return []
        medians = self._medians(state)
        state.learned = min(self.allowed, key=lambda c: (medians[c], c != self.configured, c))
        if self.mode == 2 and state.learned != self.configured:
            state.window_left = self.settings.window
        fields = {
            "bucket": bucket,
            "tokens": bucket_label(bucket),
            "learned": state.learned,
            "configured": self.configured,
            "median_ms": {str(c): round(m, 3) for c, m in medians.items()},
            "mode": self.mode,
        }
        return [Event("threads_learned", fields)]

    def _stop(self, step: Step, outcome: Outcome) -> Event:
        label = bucket_label(step.bucket)
        pair = f"{step.shadow} vs {step.serve} threads"
        if outcome.error is not None:
            why = f"{step.kind} run at {pair} in bucket {label} failed: {outcome.error}"
        else:
            why = f"{pair} gave different bits in bucket {label} tokens"
        self.stopped_reason = (
            f"{why}; learning stopped on this host, serving at {self.configured} threads"
        )
        return Event(
            "threads_learning_stopped",
            {
                "reason": self.stopped_reason,
                "bucket": step.bucket,
                "tokens": label,
                "counts": sorted({step.serve, step.shadow or step.serve}),
                "configured": self.configured,
            },
        )

    def _medians(self, state: BucketState) -> dict[int, float]:
        return {c: statistics.median(ms) for c, ms in sorted(state.samples_ms.items()) if ms}

    # -- reporting -------------------------------------------------------------------------

    def suggested_threads(self) -> int | None:
        """The learned count that covers the most served tokens (ties: fewer threads)."""
        votes: dict[int, int] = {}
        for state in self.buckets.values():
            if state.learned is not None:
                votes[state.learned] = votes.get(state.learned, 0) + state.tokens
        if not votes:
            return None
        return min(votes, key=lambda c: (-votes[c], c))

    def report(self) -> dict[str, Any]:
        table = {}
        for bucket in sorted(self.buckets):
            state = self.buckets[bucket]
            row: dict[str, Any] = {
                "tokens": bucket_label(bucket),
                "batches": state.batches,
                "learned": state.learned,
                "median_ms": {str(c): round(m, 3) for c, m in self._medians(state).items()},
                "samples": {str(c): len(ms) for c, ms in sorted(state.samples_ms.items())},
                "serving": self.plan(1 << bucket).serve,
            }
            if self.mode == 2:
                row["window_left"] = state.window_left
            table[str(bucket)] = row
        return {
            "mode": self.mode,
            "status": self.status(),
            "reason": self.reason(),
            "configured_threads": self.configured,
            "allowed_threads": list(self.allowed),
            "min_samples": self.settings.min_samples,
            "shadows": self.shadows,
            "max_shadows": self.max_shadows,
            "window": self.settings.window if self.mode == 2 else None,
            "suggested_threads": self.suggested_threads(),
            "table": table,
        }
