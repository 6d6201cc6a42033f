"""Outlier ejection: one test per rule, with an injected clock."""

from __future__ import annotations

from sr.config.schema import OutlierDetection
from sr.pool.outcome import Outcome
from sr.pool.state import ReplicaState


def on(policy, rec, outcome, now):
    """Dispatch one request to `rec` specifically and finish it with `outcome`."""
    from sr.pool.policy import Reservation

    rec.inflight += 1
    rec.outstanding_bytes += 1
    return policy.release(Reservation(rec, 1, now), outcome, now)


def test_rule1_only_timeouts_count_and_5xx_between_does_not_reset(make_policy):
    policy, (a, b), sink = make_policy(2)
    on(policy, b, Outcome.OK, 0)  # b answered ok before: does not count for rule 5
    on(policy, a, Outcome.TIMEOUT, 1)
    on(policy, b, Outcome.OK, 2)
    on(policy, a, Outcome.FAILED, 3)
    on(policy, a, Outcome.REJECTED, 4)
    on(policy, a, Outcome.CANCELED, 5)
    on(policy, a, Outcome.TIMEOUT, 6)
    assert a.consecutive_timeouts == 2 and not a.is_ejected(6)
    on(policy, a, Outcome.TIMEOUT, 7)
    assert a.is_ejected(7)
    assert sink.named("replica_ejected") == [
        {"deployment": "d", "replica": "r0", "duration_ms": 30_000, "ejections": 1}
    ]


def test_rule1_ok_resets_the_count(make_policy):
    policy, (a, b), _ = make_policy(2)
    on(policy, a, Outcome.TIMEOUT, 1)
    on(policy, a, Outcome.TIMEOUT, 2)
    on(policy, a, Outcome.OK, 3)
    on(policy, b, Outcome.OK, 4)
    on(policy, a, Outcome.TIMEOUT, 5)
    assert a.consecutive_timeouts == 1 and not a.is_ejected(5)


def test_rule2_threshold_ejects_for_base_and_probes(make_policy):
    od = OutlierDetection(consecutive_timeouts=2, base_ejection_ms=1000)
    policy, (a, b), _sink = make_policy(2, outlier=od)
    on(policy, a, Outcome.TIMEOUT, 10)
    on(policy, b, Outcome.OK, 10.5)
    assert on(policy, a, Outcome.TIMEOUT, 11) is True  # probe at once
    assert a.state(11.999) is ReplicaState.EJECTED
    assert a.snapshot(11.25).ejected_for_ms == 750
    assert a.snapshot(11.25).state.value == "ejected"
    assert a.state(12.0 + 3.2) is ReplicaState.READY  # after cooldown (and backoff)
    # while ejected, b takes all the work
    assert {policy.reserve(1, now=11.5).record.id for _ in range(5)} == {"r1"}


def test_rule2_zero_turns_ejection_off_but_timeouts_still_back_off(make_policy):
    policy, (a, b), sink = make_policy(2, outlier=OutlierDetection(consecutive_timeouts=0))
    on(policy, a, Outcome.TIMEOUT, 1)
    on(policy, b, Outcome.OK, 1)
    for t in range(2, 10):
        on(policy, a, Outcome.TIMEOUT, t)
    assert not a.is_ejected(9) and a.ejections == 0
    assert a.state(9.01) is ReplicaState.BACKOFF
    assert sink.named("replica_ejected") == [] and sink.named("replica_ejection_withheld") == []


def test_rule3_probation_doubles_up_to_max(make_policy):
    od = OutlierDetection(consecutive_timeouts=3, base_ejection_ms=1000, max_ejection_ms=3000)
    policy, (a, b), sink = make_policy(2, outlier=od)
    now = 0.0
    on(policy, a, Outcome.TIMEOUT, now)
    on(policy, b, Outcome.OK, now + 0.1)
    on(policy, a, Outcome.TIMEOUT, now + 0.2)
    on(policy, a, Outcome.TIMEOUT, now + 0.3)
    durations = [sink.named("replica_ejected")[-1]["duration_ms"]]
    for _ in range(3):
        now = a.ejected_until + 0.01  # back on probation: one timeout ejects again
        assert a.state(now + 5) is ReplicaState.READY
        on(policy, a, Outcome.TIMEOUT, now)
        durations.append(sink.named("replica_ejected")[-1]["duration_ms"])
    assert durations == [1000, 2000, 3000, 3000]
    assert a.ejections == 4


def test_rule3_default_max_is_ten_times_base():
    assert OutlierDetection(base_ejection_ms=500).effective_max_ejection_ms == 5000


def test_rule4_ok_readmits_at_once_and_resets_doubling(make_policy):
    od = OutlierDetection(consecutive_timeouts=1, base_ejection_ms=1000)
    policy, (a, b), sink = make_policy(2, outlier=od)
    on(policy, a, Outcome.TIMEOUT, 0)
    on(policy, b, Outcome.OK, 0.1)
    on(policy, a, Outcome.TIMEOUT, 0.2)  # probation not yet: count 2 >= 1 -> eject
    assert a.is_ejected(0.3)
    on(policy, a, Outcome.OK, 0.5)  # e.g. a request it served while ejected
    assert not a.is_ejected(0.5) and a.state(0.5) is ReplicaState.READY
    assert a.consecutive_timeouts == 0 and a.ejection_level == 0
    assert sink.named("replica_readmitted") == [
        {"deployment": "d", "replica": "r0", "reason": "ok"}
    ]
    on(policy, a, Outcome.TIMEOUT, 1)
    on(policy, b, Outcome.OK, 1.1)
    on(policy, a, Outcome.TIMEOUT, 1.2)
    assert sink.named("replica_ejected")[-1]["duration_ms"] == 1000  # doubling reset


def test_rule5_never_eject_the_serving_replica(make_policy):
    policy, (a, b), sink = make_policy(2)
    on(policy, b, Outcome.OK, 0)  # an ok *before* a's streak does not count
    for t in (1, 2, 3, 4):
        on(policy, a, Outcome.TIMEOUT, t)
        on(policy, b, Outcome.TIMEOUT, t)  # slow on every replica
    assert not a.is_ejected(4) and not b.is_ejected(4)
    assert {e["rule"] for e in sink.named("replica_ejection_withheld")} == {"serving_replica"}
    on(policy, b, Outcome.OK, 5)
    on(policy, a, Outcome.TIMEOUT, 6)
    assert a.is_ejected(6)


def test_rule6_percent_cap_rounds_down_but_one_may_always_be_ejected(make_policy):
    od = OutlierDetection(consecutive_timeouts=1, max_ejection_percent=10)
    policy, recs, sink = make_policy(3, outlier=od)  # 10% of 3 = 0.3 -> 0, but one allowed
    a, b, c = recs
    on(policy, a, Outcome.TIMEOUT, 0)
    on(policy, b, Outcome.TIMEOUT, 0)
    on(policy, c, Outcome.OK, 1)
    on(policy, a, Outcome.TIMEOUT, 2)
    assert a.is_ejected(2)
    on(policy, b, Outcome.TIMEOUT, 3)
    assert not b.is_ejected(3)
    assert sink.named("replica_ejection_withheld")[-1]["rule"] == "max_ejection_percent"


def test_rule6_fifty_percent_of_four_is_two(make_policy):
    policy, recs, _sink = make_policy(4, outlier=OutlierDetection(consecutive_timeouts=1))
    on(policy, recs[3], Outcome.TIMEOUT, 0)
    for r in recs[:3]:
        on(policy, r, Outcome.TIMEOUT, 0)
    on(policy, recs[3], Outcome.OK, 1)
    for r in recs[:3]:
        on(policy, r, Outcome.TIMEOUT, 2)
    assert [r.is_ejected(2) for r in recs] == [True, True, False, False]


def test_rule6_single_replica_never_ejects(make_policy):
    policy, (a,), sink = make_policy(1, outlier=OutlierDetection(consecutive_timeouts=1))
    for t in range(5):
        on(policy, a, Outcome.TIMEOUT, t)
    assert a.ejections == 0
    assert sink.named("replica_ejection_withheld")[0]["rule"] == "single_replica"


def test_rule7_ejected_replica_serves_when_nothing_else_can(make_policy):
    policy, (a, b), _ = make_policy(2, outlier=OutlierDetection(consecutive_timeouts=1))
    on(policy, a, Outcome.TIMEOUT, 0)
    on(policy, b, Outcome.OK, 0.5)
    on(policy, a, Outcome.TIMEOUT, 1)
    assert a.is_ejected(5)
    held = [policy.reserve(1, now=5) for _ in range(32)]
    assert {r.record.id for r in held} == {"r1"}
    assert policy.reserve(1, now=5).record is a  # b is full
    policy.set_lifecycle(b, ReplicaState.UNREACHABLE, 5, "connection refused")
    assert policy.reserve(1, now=5).record is a  # b is gone


def test_rule8_events_and_inventory(make_policy):
    od = OutlierDetection(consecutive_timeouts=1, base_ejection_ms=2000)
    policy, (a, b), sink = make_policy(2, outlier=od)
    on(policy, a, Outcome.TIMEOUT, 0)
    on(policy, b, Outcome.OK, 0.5)
    on(policy, a, Outcome.TIMEOUT, 1)
    row = a.snapshot(1.5)
    assert (row.state.value, row.ejected_for_ms, row.ejections) == ("ejected", 1500, 1)
    assert sink.named("replica_state")[-1]["state"] == "ejected"
    policy.refresh(3.5)  # the cooldown has ended: readmitted on probation
    assert sink.named("replica_readmitted") == [
        {"deployment": "d", "replica": "r0", "reason": "cooldown"}
    ]
    assert sink.named("replica_state")[-1] == {
        "deployment": "d",
        "replica": "r0",
        "state": "ready",
        "reason": None,
    }
    assert a.snapshot(3.5).ejected_for_ms is None


def test_a_cooldown_noticed_by_the_prober_first_is_still_a_readmission(make_policy):
    """The prober may set the lifecycle (READY again) after the ejection ended and before
    the timer task's refresh: the readmission is reported either way, once."""
    od = OutlierDetection(consecutive_timeouts=1, base_ejection_ms=2000)
    policy, (a, b), sink = make_policy(2, outlier=od)
    on(policy, a, Outcome.TIMEOUT, 0)
    on(policy, b, Outcome.OK, 0.5)
    on(policy, a, Outcome.TIMEOUT, 1)
    assert sink.named("replica_state")[-1]["state"] == "ejected"
    policy.set_lifecycle(a, ReplicaState.READY, 3.5)  # the prober's tick, first
    policy.refresh(3.6)  # then the timer
    assert sink.named("replica_readmitted") == [
        {"deployment": "d", "replica": "r0", "reason": "cooldown"}
    ]
