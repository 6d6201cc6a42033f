"""Outcomes of one dispatched exchange (SPEC section 5) and how a status maps onto them."""

from __future__ import annotations

import enum


class Outcome(enum.Enum):
    OK = "ok"  # 2xx
    REJECTED = "rejected"  # 4xx, or refused before sending
    FAILED = "failed"  # 5xx or transport error
    TIMEOUT = "timeout"  # the effective deadline fired
    CANCELED = "canceled"  # the caller went away before its deadline


def outcome_of_status(status: int) -> Outcome:
    if 200 <= status < 300:
        return Outcome.OK
    if 400 <= status < 500:
        return Outcome.REJECTED
    return Outcome.FAILED
