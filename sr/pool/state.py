"""The replica state machine: every rule about a replica's state, in one place.

Rules
-----
A replica has a *lifecycle* state, driven by its process and its health probes, and two
time-bounded *overlays* that only apply while the lifecycle is READY:

    lifecycle   STARTING -> LOADING -> WARMING -> READY      (health reports progress)
                any live state -> UNREACHABLE                 (probe cannot connect)
                any live state -> RESTARTING -> STARTING      (managed process exited)
                any live state -> FAILED                      (terminal, see below)
                live -> INCOMPATIBLE                          (card's engine caps differ)
                any state -> DRAINING                         (retired by a reload/stop)
    overlays    EJECTED  while now < ejected_until            (outlier ejection, sec. 6)
                BACKOFF  while now < backoff_until            (failed/timeout, sec. 5)

The state shown in the inventory is the lifecycle state unless it is READY, in which case
EJECTED wins over BACKOFF wins over READY (`effective_state`).

Only READY replicas are dispatched to; an EJECTED one only when nothing else can take the
request. FAILED and DRAINING are never left except by replacing the replica (a reload
creates a new one); INCOMPATIBLE is left only if its process exits (and restarts).
A replica is *terminal* when it is FAILED or INCOMPATIBLE:
FAILED means the worker reported `failed` on /health (for example an artifact that does not
resolve, or a golden check that did not pass), or a managed worker exited
`TERMINAL_EARLY_EXITS` times in a row without ever becoming ready.
"""

from __future__ import annotations

import enum

TERMINAL_EARLY_EXITS = 3


class ReplicaState(enum.Enum):
    STARTING = "starting"
    LOADING = "loading"
    WARMING = "warming"
    READY = "ready"
    BACKOFF = "backoff"
    EJECTED = "ejected"
    INCOMPATIBLE = "incompatible"
    RESTARTING = "restarting"
    DRAINING = "draining"
    FAILED = "failed"
    UNREACHABLE = "unreachable"


S = ReplicaState

# Lifecycle states only; BACKOFF and EJECTED are overlays, never stored as lifecycle.
_LIVE = {S.STARTING, S.LOADING, S.WARMING, S.READY, S.UNREACHABLE}
_LEAVE_LIVE = {S.RESTARTING, S.FAILED, S.DRAINING, S.INCOMPATIBLE}

# allowed lifecycle transitions: from-state -> set of to-states
TRANSITIONS: dict[ReplicaState, frozenset[ReplicaState]] = {
    S.STARTING: frozenset(_LIVE | _LEAVE_LIVE),
    S.LOADING: frozenset(_LIVE | _LEAVE_LIVE),
    S.WARMING: frozenset(_LIVE | _LEAVE_LIVE),
    S.READY: frozenset(_LIVE | _LEAVE_LIVE),
    S.UNREACHABLE: frozenset(_LIVE | _LEAVE_LIVE),
    S.RESTARTING: frozenset({S.STARTING, S.FAILED, S.DRAINING}),
    S.INCOMPATIBLE: frozenset({S.RESTARTING, S.FAILED, S.DRAINING}),
    S.FAILED: frozenset({S.DRAINING}),
    S.DRAINING: frozenset(),
}

# what a worker's /health `status` field means for the lifecycle
HEALTH_STATUS = {
    "ready": S.READY,
    "starting": S.STARTING,
    "loading": S.LOADING,
    "warming": S.WARMING,
    "failed": S.FAILED,
}

TERMINAL = frozenset({S.FAILED, S.INCOMPATIBLE})


class IllegalTransition(Exception):
    pass


def check_transition(old: ReplicaState, new: ReplicaState) -> bool:
    """True if the lifecycle changes; raises if the table forbids the move."""
    if old is new:
        return False
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(f"{old.value} -> {new.value}")
    return True


def effective_state(
    lifecycle: ReplicaState, now: float, backoff_until: float, ejected_until: float
) -> ReplicaState:
    if lifecycle is not S.READY:
        return lifecycle
    if now < ejected_until:
        return S.EJECTED
    if now < backoff_until:
        return S.BACKOFF
    return S.READY
