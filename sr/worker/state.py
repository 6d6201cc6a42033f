"""The worker's lifecycle: every rule about its state, in one place.

Rules
-----
A worker process starts STARTING, then loads its model and warms it up; it ends READY or
FAILED and stays there until it exits:

    STARTING -> LOADING              the model is being loaded on the device thread
    LOADING  -> WARMING | FAILED     loaded (the warm-up runs), or it could not be loaded
    WARMING  -> READY   | FAILED     golden check, batching probe and thread calibration
                                     passed, or one of them did not
    READY, FAILED                    settled: never left (a new process starts over)

Only a READY worker forwards; in every other state its task routes answer 503 with the
state. `/health` answers 200 `{"status": "ready"}` when READY and 503 `{"status": <state>,
"reason": ...}` otherwise: the `status` values are this enum's, which is what the pool reads
into a replica's lifecycle (sr.pool.state.HEALTH_STATUS).
"""

from __future__ import annotations

import enum


class WorkerState(enum.Enum):
    STARTING = "starting"
    LOADING = "loading"
    WARMING = "warming"
    READY = "ready"
    FAILED = "failed"


W = WorkerState

# allowed transitions: from-state -> set of to-states
TRANSITIONS: dict[WorkerState, frozenset[WorkerState]] = {
    W.STARTING: frozenset({W.LOADING}),
    W.LOADING: frozenset({W.WARMING, W.FAILED}),
    W.WARMING: frozenset({W.READY, W.FAILED}),
    W.READY: frozenset(),
    W.FAILED: frozenset(),
}

SETTLED = frozenset({W.READY, W.FAILED})


class IllegalTransition(Exception):
    pass


def check_transition(old: WorkerState, new: WorkerState) -> None:
    """Raises if the table forbids moving from `old` to `new`."""
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(f"{old.value} -> {new.value}")
