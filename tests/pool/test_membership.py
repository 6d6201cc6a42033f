"""The pure rules of discovered membership (sr.pool.membership): no sockets, no clock."""

from __future__ import annotations

import math

import pytest

from sr.pool.membership import (
    MIN_INTERVAL_S,
    ResolutionSchedule,
    address_text,
    diff_membership,
)

A = ("10.0.0.1", 8100)
B = ("10.0.0.2", 8100)
C = ("10.0.0.3", 8100)
B_OTHER_PORT = ("10.0.0.2", 8101)


def test_the_same_set_in_any_order_with_repeats_changes_nothing():
    diff = diff_membership([A, B, C], [C, A, B, A])
    assert diff.unchanged
    assert diff.staying == (A, B, C) and diff.joining == diff.leaving == ()


def test_new_addresses_join_vanished_ones_leave_the_rest_stay():
    diff = diff_membership([A, B], [B, C])
    assert (diff.joining, diff.leaving, diff.staying) == ((C,), (A,), (B,))
    assert not diff.unchanged


def test_identity_is_address_and_port():
    diff = diff_membership([B], [B_OTHER_PORT])
    assert (diff.joining, diff.leaving) == ((B_OTHER_PORT,), (B,))


def test_first_resolution_everything_joins():
    assert diff_membership([], [B, A]).joining == (A, B)


def test_address_text_brackets_ipv6():
    assert address_text(A) == "10.0.0.1:8100"
    assert address_text(("fd00::5", 8100)) == "[fd00::5]:8100"


def test_first_resolution_is_due_at_once_then_every_refresh():
    schedule = ResolutionSchedule(refresh_s=30)
    assert schedule.is_due(0.0)
    schedule.resolved(0.0, ok=True)
    assert not schedule.is_due(29.9)
    assert schedule.next_due() == 30.0
    schedule.resolved(30.0, ok=True)
    assert schedule.next_due() == 60.0


def test_failures_retry_after_one_second_doubling_up_to_refresh():
    schedule = ResolutionSchedule(refresh_s=10)
    now = 0.0
    waits = []
    for _ in range(6):
        schedule.resolved(now, ok=False)
        waits.append(schedule.next_due() - now)
        now = schedule.next_due()
    assert waits == [1, 2, 4, 8, 10, 10]
    schedule.resolved(now, ok=True)  # a success resets the doubling
    assert schedule.next_due() - now == 10
    schedule.resolved(now + 10, ok=False)
    assert schedule.next_due() - (now + 10) == 1


def test_a_replica_failure_brings_resolution_forward_but_not_within_a_second():
    schedule = ResolutionSchedule(refresh_s=30)
    schedule.resolved(100.0, ok=True)
    schedule.replica_failed(100.2)  # just resolved: not before 101
    assert schedule.next_due() == pytest.approx(100.0 + MIN_INTERVAL_S)
    schedule.resolved(101.0, ok=True)
    schedule.replica_failed(115.0)  # long after: at once
    assert schedule.is_due(115.0) and schedule.next_due() == 115.0
    # many failures in a burst: still one resolution a second at most
    schedule.resolved(115.0, ok=True)
    for t in (115.1, 115.2, 115.3):
        schedule.replica_failed(t)
    assert not schedule.is_due(115.9) and schedule.is_due(116.0)


def test_a_failure_hint_never_delays_a_resolution_already_due_sooner():
    schedule = ResolutionSchedule(refresh_s=30)
    schedule.resolved(0.0, ok=False)  # retry at 1.0
    schedule.replica_failed(0.5)
    assert schedule.next_due() == 1.0


def test_reload_changing_refresh_reschedules_from_the_last_resolution():
    schedule = ResolutionSchedule(refresh_s=30)
    schedule.resolved(10.0, ok=True)
    schedule.set_refresh(5)
    assert schedule.next_due() == 15.0
    fresh = ResolutionSchedule(refresh_s=30)
    fresh.set_refresh(5)  # never resolved: still due at once
    assert fresh.next_due() == -math.inf and fresh.is_due(0.0)
