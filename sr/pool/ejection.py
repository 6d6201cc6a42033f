"""Outlier ejection: which timeouts eject a replica, and for how long.

Rules, each enforced in exactly one place below:

1. Only `timeout` counts; `ok` resets the count; failed/rejected/canceled neither count
   nor reset (`DeploymentPolicy.release` calls `on_timeout` / `on_ok` only).
2. At `consecutive_timeouts` (0 = off) the replica is ejected for `base_ejection_ms` and
   probed at once (`should_try` + `eject`).
3. After the cooldown it returns on probation; its next timeout ejects again for twice as
   long, doubling up to `effective_max_ejection_ms` (`ejection_ms`).
4. An `ok` readmits at once and resets the count and the doubling (`on_ok`).
5. Never eject the serving replica: only if another ready replica answered `ok` after this
   replica's first timeout of the streak (`withheld_rule`, "serving_replica").
6. At most `max_ejection_percent` of the replicas ejected at once, rounded down, but one
   may always be; a single-replica deployment never ejects (`withheld_rule`).
7. When nothing else can take a request an ejected replica serves it (the dispatch
   fallback in `sr.pool.policy`).
8. Events: `replica_ejected`, `replica_readmitted`, `replica_ejection_withheld` (`rule`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sr.config.schema import OutlierDetection
from sr.pool.backoff import capped_doubling
from sr.pool.record import ReplicaRecord
from sr.pool.state import ReplicaState


def ejection_ms(config: OutlierDetection, level: int) -> int:
    """Rule 3: base doubled `level` times, capped at the effective maximum."""
    return capped_doubling(config.base_ejection_ms, config.effective_max_ejection_ms, level)


def max_ejected(config: OutlierDetection, replicas: int) -> int:
    """Rule 6: the percentage rounded down, but at least one (single replica: none)."""
    if replicas <= 1:
        return 0
    return max(1, math.floor(config.max_ejection_percent * replicas / 100))


def should_try(config: OutlierDetection, rec: ReplicaRecord, now: float) -> bool:
    """Rules 2 and 3: does this timeout reach the ejection threshold?"""
    if config.consecutive_timeouts <= 0 or rec.is_ejected(now):
        return False
    return rec.on_probation or rec.consecutive_timeouts >= config.consecutive_timeouts


def withheld_rule(
    config: OutlierDetection, rec: ReplicaRecord, replicas: Sequence[ReplicaRecord], now: float
) -> str | None:
    """Rules 5 and 6: the name of the rule that blocks ejecting `rec`, or None."""
    if len(replicas) <= 1:
        return "single_replica"
    others_ok = any(
        other is not rec
        and other.lifecycle is ReplicaState.READY
        and other.last_ok_mark > rec.streak_mark
        for other in replicas
    )
    if not others_ok:
        return "serving_replica"
    ejected_now = sum(1 for other in replicas if other is not rec and other.is_ejected(now))
    if ejected_now + 1 > max_ejected(config, len(replicas)):
        return "max_ejection_percent"
    return None


def eject(config: OutlierDetection, rec: ReplicaRecord, now: float) -> int:
    """Eject `rec` now; returns the duration in ms. After it, the replica is on probation."""
    duration = ejection_ms(config, rec.ejection_level)
    rec.ejection_level += 1
    rec.ejections += 1
    rec.ejected_until = now + duration / 1000
    rec.on_probation = True
    return duration


def on_timeout(rec: ReplicaRecord, mark: int) -> None:
    """Rule 1: a timeout counts; the first of a streak remembers when the streak began."""
    if rec.consecutive_timeouts == 0:
        rec.streak_mark = mark
    rec.consecutive_timeouts += 1


def on_ok(rec: ReplicaRecord, mark: int, now: float) -> bool:
    """Rules 1 and 4: reset; returns True if the replica was ejected and is readmitted."""
    was_ejected = rec.is_ejected(now)
    rec.consecutive_timeouts = 0
    rec.last_ok_mark = mark
    rec.ejection_level = 0
    rec.on_probation = False
    rec.ejected_until = -math.inf
    return was_ejected
