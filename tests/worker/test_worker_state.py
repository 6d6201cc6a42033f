"""The worker's lifecycle table (sr.worker.state), and what the pool reads from it."""

from __future__ import annotations

import itertools

import pytest

from sr.pool.state import HEALTH_STATUS, ReplicaState
from sr.worker.state import (
    SETTLED,
    TRANSITIONS,
    IllegalTransition,
    WorkerState,
    check_transition,
)

W = WorkerState
ALLOWED = [
    (W.STARTING, W.LOADING),
    (W.LOADING, W.WARMING),
    (W.LOADING, W.FAILED),
    (W.WARMING, W.READY),
    (W.WARMING, W.FAILED),
]


def test_the_table_holds_exactly_the_documented_moves():
    table = {(old, new) for old, targets in TRANSITIONS.items() for new in targets}
    assert table == set(ALLOWED)
    assert set(TRANSITIONS) == set(WorkerState)


@pytest.mark.parametrize(("old", "new"), ALLOWED)
def test_every_allowed_move_passes(old, new):
    check_transition(old, new)


@pytest.mark.parametrize(
    ("old", "new"),
    [pair for pair in itertools.product(WorkerState, repeat=2) if pair not in ALLOWED],
)
def test_every_other_move_raises(old, new):
    with pytest.raises(IllegalTransition, match=f"{old.value} -> {new.value}"):
        check_transition(old, new)


def test_ready_and_failed_are_settled_and_never_left():
    assert {W.READY, W.FAILED} == SETTLED
    assert all(not TRANSITIONS[state] for state in SETTLED)


def test_the_pool_reads_every_health_status_the_worker_can_answer():
    assert set(HEALTH_STATUS) == {state.value for state in WorkerState}
    assert HEALTH_STATUS["ready"] is ReplicaState.READY
    assert HEALTH_STATUS["failed"] is ReplicaState.FAILED
