"""The replica state machine: every rule about a replica's state, in one place.

Rules
-----
A replica has a *lifecycle* state, driven by its process and its health probes, and two
time-bounded *overlays* that only apply while the lifecycle is READY:

    lifecycle   STARTING -> LOADING -> WARMING -> READY      (health reports progress)
                any live state -> UNREACHABLE                 (probe cannot connect)
                any live state -> RESTARTING -> STARTING      (managed process exited)
                any live state -> FAILED                      (see *terminal* below)
                live -> INCOMPATIBLE                          (card's artifact/caps differ)
                FAILED, INCOMPATIBLE -> live                  (attached replicas only)
                any state -> DRAINING                         (retired by a reload/stop)
    overlays    EJECTED  while now < ejected_until            (outlier ejection, sec. 6)
                BACKOFF  while now < backoff_until            (failed/timeout, sec. 5)

The state shown in the inventory is the lifecycle state unless it is READY, in which case
EJECTED wins over BACKOFF wins over READY (`effective_state`).

Only READY replicas are dispatched to; an EJECTED one only when nothing else can take the
request. DRAINING is never left (a reload creates a new replica): a retired replica's
prober keeps running while its in-flight requests finish, and any other state it (or its
process's exit) reports then is dropped (`is_dropped`), not an illegal move.

A worker's /health `status` is one of sr.worker.state.WorkerState's values; `HEALTH_STATUS`
says which lifecycle state each one means.

Managed and in-process replicas (`TRANSITIONS`): FAILED is never left except by replacing
the replica; INCOMPATIBLE is left only if its process exits (and restarts). Such a replica
is *terminal* when it is FAILED or INCOMPATIBLE, and a deployment whose replicas are all
terminal fails startup at once:
FAILED means the worker reported `failed` on /health (for example an artifact that does not
resolve, or a golden check that did not pass), or a managed worker exited
`TERMINAL_EARLY_EXITS` times in a row without ever becoming ready.

Attached replicas (`ATTACHED_TRANSITIONS`) are never terminal: the operator restarts those
workers, not the router. A failed or incompatible attached replica is reported as such and
never dispatched to, but it is re-probed at the slow cadence and returns to a live state
when /health (and, once ready, its card) says so. So startup does not fail fast on them
(it waits for the ready timeout); a reload still fails at once when a replica it adds is
failed or incompatible, since the old config keeps serving.
"""

from __future__ import annotations

import enum

from sr.worker.state import WorkerState

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

# Attached replicas: no process of ours to restart, so FAILED and INCOMPATIBLE are left
# whenever a probe sees the operator's worker come back (or change its card).
ATTACHED_TRANSITIONS: dict[ReplicaState, frozenset[ReplicaState]] = {
    **TRANSITIONS,
    S.INCOMPATIBLE: frozenset(_LIVE | {S.FAILED, S.DRAINING}),
    S.FAILED: frozenset(_LIVE | {S.INCOMPATIBLE, S.DRAINING}),
}

# what a worker's /health `status` field (sr.worker.state) means for the lifecycle
HEALTH_STATUS: dict[str, ReplicaState] = {
    WorkerState.READY.value: S.READY,
    WorkerState.STARTING.value: S.STARTING,
    WorkerState.LOADING.value: S.LOADING,
    WorkerState.WARMING.value: S.WARMING,
    WorkerState.FAILED.value: S.FAILED,
}

TERMINAL = frozenset({S.FAILED, S.INCOMPATIBLE})


class IllegalTransition(Exception):
    pass


def is_terminal(lifecycle: ReplicaState, *, attached: bool) -> bool:
    """True when the replica can never serve again on its own (never for attached ones)."""
    return not attached and lifecycle in TERMINAL


def is_dropped(old: ReplicaState, new: ReplicaState) -> bool:
    """True when `new` reaches a DRAINING replica: it is never left, so the report is
    dropped (module docstring)."""
    return old is S.DRAINING and new is not S.DRAINING


def check_transition(old: ReplicaState, new: ReplicaState, *, attached: bool = False) -> bool:
    """True if the lifecycle changes; raises if the table forbids the move."""
    if old is new:
        return False
    table = ATTACHED_TRANSITIONS if attached else TRANSITIONS
    if new not in table[old]:
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
