"""Dispatch, admission and backoff rules, with an injected clock."""

from __future__ import annotations

import collections

import pytest

from sr.errors import Overloaded, Unavailable
from sr.pool.backoff import RestartBackoff, capped_doubling
from sr.pool.outcome import Outcome, outcome_of_status
from sr.pool.state import IllegalTransition, ReplicaState, check_transition, is_dropped


def test_idle_sequential_requests_spread_evenly(make_policy):
    policy, _records, _ = make_policy(4)
    counts = collections.Counter()
    for _ in range(12):
        res = policy.reserve(100, now=1.0)
        counts[res.record.id] += 1
        policy.release(res, Outcome.OK, now=1.0)
    assert counts == {"r0": 3, "r1": 3, "r2": 3, "r3": 3}


def test_fewest_outstanding_bytes_wins(make_policy):
    policy, _records, _ = make_policy(3)
    big = policy.reserve(10_000, now=0)
    small = policy.reserve(10, now=0)
    assert {big.record.id, small.record.id} == {"r0", "r1"}
    third = policy.reserve(5, now=0)
    assert third.record.id == "r2"
    fourth = policy.reserve(5, now=0)  # r2 has 5, r(small) 10, r(big) 10000
    assert fourth.record is third.record
    fifth = policy.reserve(1, now=0)  # now r2 has 10 and small has 10: LRA tie -> small
    assert fifth.record is small.record


def test_zero_byte_requests_still_count_one(make_policy):
    policy, _records, _ = make_policy(2)
    res = policy.reserve(0, now=0)
    assert res.record.outstanding_bytes == 1
    assert policy.reserve(0, now=0).record is not res.record


def test_two_workers_admit_exactly_64_then_overloaded(make_policy):
    policy, records, _ = make_policy(2)
    held = [policy.reserve(50, now=0) for _ in range(64)]
    assert [r.inflight for r in records] == [32, 32]
    with pytest.raises(Overloaded) as info:
        policy.reserve(50, now=0)
    assert info.value.headers["Retry-After"] == "1"
    policy.release(held[0], Outcome.CANCELED, now=0)
    assert policy.reserve(50, now=0).record is held[0].record


def test_release_is_exactly_once(make_policy):
    policy, records, _ = make_policy(1)
    res = policy.reserve(10, now=0)
    policy.release(res, Outcome.OK, now=0)
    policy.release(res, Outcome.FAILED, now=0)
    assert (records[0].inflight, records[0].outstanding_bytes) == (0, 0)
    assert records[0].backoff.consecutive_bad == 0


def test_no_ready_replica_is_unavailable(make_policy):
    policy, _records, _ = make_policy(2, ready=False)
    with pytest.raises(Unavailable):
        policy.reserve(1, now=0)


def test_all_in_backoff_is_unavailable_then_recovers(make_policy):
    policy, records, _ = make_policy(2)
    for _ in range(2):
        res = policy.reserve(1, now=0)
        assert policy.release(res, Outcome.FAILED, now=0) is True  # probe requested
    assert [r.state(0.05).value for r in records] == ["backoff", "backoff"]
    with pytest.raises(Unavailable):
        policy.reserve(1, now=0.05)
    assert policy.reserve(1, now=0.1).record in records


def test_backoff_sequence_doubles_to_cap_and_ok_clears(make_policy):
    policy, records, _ = make_policy(1)
    rec = records[0]
    now, delays = 0.0, []
    for _ in range(7):
        res = policy.reserve(1, now=now)
        policy.release(res, Outcome.FAILED if len(delays) % 2 else Outcome.TIMEOUT, now=now)
        delays.append(round(rec.backoff.until - now, 6))
        now = rec.backoff.until
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 3.2]
    policy.release(policy.reserve(1, now=now), Outcome.OK, now=now)
    assert rec.state(now) is ReplicaState.READY
    policy.release(policy.reserve(1, now=now), Outcome.FAILED, now=now)
    assert rec.backoff.until - now == pytest.approx(0.1)


def test_rejected_and_canceled_do_not_back_off(make_policy):
    policy, records, _ = make_policy(1)
    for outcome in (Outcome.REJECTED, Outcome.CANCELED):
        assert policy.release(policy.reserve(1, now=0), outcome, now=0) is False
    assert records[0].state(0) is ReplicaState.READY


def test_incompatible_replica_gets_nothing(make_policy):
    policy, records, sink = make_policy(2)
    policy.set_lifecycle(records[1], ReplicaState.INCOMPATIBLE, 0, "max_num_seqs 32 != 64")
    for _ in range(32):
        assert policy.reserve(1, now=0).record is records[0]
    with pytest.raises(Overloaded):
        policy.reserve(1, now=0)
    assert sink.named("replica_state")[-1] == {
        "deployment": "d",
        "replica": "r1",
        "state": "incompatible",
        "reason": "max_num_seqs 32 != 64",
    }


def test_assignment_sequence_is_shared(make_policy):
    policy, _records, _ = make_policy(2)
    a = policy.reserve(1, now=0)
    b = policy.reserve(1, now=0)
    assert b.record.last_assigned == a.record.last_assigned + 1


def test_outcome_of_status():
    assert outcome_of_status(200) is Outcome.OK
    assert outcome_of_status(422) is Outcome.REJECTED
    assert outcome_of_status(503) is Outcome.FAILED


def test_state_table_forbids_leaving_terminal_states():
    assert check_transition(ReplicaState.STARTING, ReplicaState.READY) is True
    assert check_transition(ReplicaState.READY, ReplicaState.READY) is False
    with pytest.raises(IllegalTransition):
        check_transition(ReplicaState.FAILED, ReplicaState.READY)
    with pytest.raises(IllegalTransition):
        check_transition(ReplicaState.DRAINING, ReplicaState.READY)


def test_a_draining_replica_drops_what_it_reports_later():
    # DRAINING is never left: a late probe or exit is dropped, not an illegal move.
    for new in ReplicaState:
        assert is_dropped(ReplicaState.DRAINING, new) is (new is not ReplicaState.DRAINING)
        if new is not ReplicaState.DRAINING:
            assert not is_dropped(new, ReplicaState.DRAINING)


def test_restart_backoff_doubles_to_60_and_resets_after_two_healthy_minutes():
    rb = RestartBackoff()
    delays = [rb.exited(now=float(i)) for i in range(8)]
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60]
    rb.became_ready(100.0)
    assert rb.exited(now=219.0) == 60  # healthy 119 s: not yet reset
    rb.became_ready(300.0)
    assert rb.exited(now=420.0) == 1
    assert rb.restarts == 10


def test_capped_doubling_keeps_ints_and_survives_huge_steps():
    assert [capped_doubling(0.1, 3.2, step) for step in range(7)] == [
        0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 3.2
    ]  # fmt: skip
    ms = [capped_doubling(1000, 3000, step) for step in (0, 1, 2, 10_000)]
    assert ms == [1000, 2000, 3000, 3000] and all(type(value) is int for value in ms)
    assert capped_doubling(1.0, 300.0, 5000) == 300.0  # 2**5000 * 1.0 would overflow a float


def test_every_ready_replica_backing_off_says_so_with_retry_after(make_policy):
    policy, _records, _ = make_policy(2)
    for now in (0, 0, 0.1, 0.1):  # both fail twice: backing off until 0.1, then 0.3
        policy.release(policy.reserve(1, now=now), Outcome.FAILED, now=now)
    with pytest.raises(Unavailable) as info:
        policy.reserve(1, now=0.2)
    assert str(info.value) == (
        "deployment 'd': every ready replica is backing off after failures (next in 0.1s)"
    )
    assert info.value.code == "unavailable"
    assert info.value.headers == {"Retry-After": "1"}


def test_no_ready_replica_message_is_unchanged_and_has_no_retry_after(make_policy):
    policy, _records, _ = make_policy(2, ready=False)
    with pytest.raises(Unavailable, match="has no ready replica") as info:
        policy.reserve(1, now=0)
    assert info.value.headers == {}


def test_restart_backoff_counts_only_time_spent_ready(make_policy):
    policy, records, _ = make_policy(1, ready=False)
    rec = records[0]
    for i in range(3):
        rec.restart.exited(now=float(i))  # next delay would be 8 s
    policy.set_lifecycle(rec, ReplicaState.READY, 10.0)
    policy.set_lifecycle(rec, ReplicaState.UNREACHABLE, 20.0, "connection refused")
    assert rec.restart.healthy_since is None
    policy.set_lifecycle(rec, ReplicaState.READY, 200.0)
    # 10 s + 50 s healthy, never 2 minutes in a row: no reset despite 240 s since first ready
    assert rec.restart.exited(now=250.0) == 8


def test_restart_backoff_resets_after_a_long_healthy_stretch_that_then_broke(make_policy):
    policy, records, _ = make_policy(1, ready=False)
    rec = records[0]
    for i in range(3):
        rec.restart.exited(now=float(i))
    policy.set_lifecycle(rec, ReplicaState.READY, 10.0)
    policy.set_lifecycle(rec, ReplicaState.UNREACHABLE, 140.0, "connection refused")
    assert rec.restart.exited(now=141.0) == 1  # the 130 s ready stretch counts
