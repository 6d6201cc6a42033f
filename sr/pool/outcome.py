"""Outcomes of one dispatched exchange: how an answer's status, and the
one place how a transport failure (sr.errors.TransportError, typed by phase), map onto them."""

from __future__ import annotations

import enum

from sr.errors import TransportError, WorkerFailed


class Outcome(enum.Enum):
    OK = "ok"  # 2xx
    REJECTED = "rejected"  # 4xx, or refused before sending
    FAILED = "failed"  # 5xx or transport error
    TIMEOUT = "timeout"  # the effective deadline fired, and it was one a healthy replica meets
    # The caller's deadline fired before any healthy replica could have answered
    # (sr.pool.service_times): 504 to the caller, nothing against the replica.
    SHORT_DEADLINE = "short_deadline"
    CANCELED = "canceled"  # the caller went away before its deadline


def outcome_of_status(status: int) -> Outcome:
    if 200 <= status < 300:
        return Outcome.OK
    if 400 <= status < 500:
        return Outcome.REJECTED
    return Outcome.FAILED


def outcome_of_transport_error(error: TransportError) -> Outcome:
    """FAILED in every phase: a replica that refuses connections is as broken as one that
    resets them mid-answer, and both count towards its backoff and ejection. The phase
    (`error.reached_worker`) decides only whether the request may be written again."""
    return Outcome.FAILED


def no_answer(error: TransportError, replica: str, deployment: str) -> WorkerFailed:
    """What the caller is told (502) when a replica gave no HTTP answer."""
    failed = WorkerFailed(f"replica {replica} of {deployment!r}: {error}")
    failed.__cause__ = error
    return failed
