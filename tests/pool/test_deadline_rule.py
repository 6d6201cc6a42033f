"""Which deadlines count against a replica: the deployment's own `timeout_ms` always; a
caller's only when a healthy replica could have met it (sr.pool.service_times), so that no
caller can eject replicas with deadlines nobody meets."""

from __future__ import annotations

from sr.config.schema import OutlierDetection
from sr.pool.outcome import Outcome
from sr.pool.service_times import ServiceTimes


def _finish(policy, nbytes, started, now, outcome=None, deadline=None, own=False):
    """Dispatch one request of `nbytes` at `started`; finish it at `now` with `outcome`, or
    (outcome None) with its deadline firing at `deadline`."""
    res = policy.reserve(nbytes, started)
    if outcome is None:
        outcome = policy.deadline_outcome(res, deadline, own)
    policy.release(res, outcome, now)
    return res.record, outcome


def test_a_deadline_under_the_floor_never_counts_and_never_backs_off(make_policy):
    policy, (a, b), sink = make_policy(2)
    for i in range(20):
        t = float(i)
        rec, outcome = _finish(policy, 10, t, t + 0.001, deadline=t + 0.001)
        assert outcome is Outcome.SHORT_DEADLINE
        assert rec.consecutive_timeouts == 0 and rec.backoff.until <= t
    _finish(policy, 10, 30.0, 30.005, Outcome.OK)
    assert not a.is_ejected(31) and not b.is_ejected(31)
    assert sink.named("replica_ejected") == []


def test_a_caller_deadline_shorter_than_healthy_service_counts_for_nothing(make_policy):
    od = OutlierDetection(min_deadline_ms=10)
    policy, (a, b), sink = make_policy(2, outlier=od)
    for i in range(10):  # healthy answers take 200 ms for this size
        _finish(policy, 500, float(i), i + 0.2, Outcome.OK)
    for i in range(10):  # 50 ms deadlines: above the floor, below any healthy answer
        t = 20.0 + i
        _, outcome = _finish(policy, 500, t, t + 0.05, deadline=t + 0.05)
        assert outcome is Outcome.SHORT_DEADLINE
    assert a.consecutive_timeouts == b.consecutive_timeouts == 0
    assert sink.named("replica_ejected") == []
    # a deadline a healthy replica meets does count, and ejects as before
    for i in range(3):
        t = 40.0 + i
        _finish(policy, 500, t, t + 0.001, Outcome.OK)  # keeps the other replica "ok"
        _finish(policy, 500, t + 0.5, t + 1.0, deadline=t + 1.0)
    assert len(sink.named("replica_ejected")) == 1


def test_the_deployments_own_timeout_always_counts(make_policy):
    od = OutlierDetection(min_deadline_ms=10_000)
    policy, _, _ = make_policy(2, outlier=od)
    _, outcome = _finish(policy, 10, 0.0, 0.001, deadline=0.001, own=True)
    assert outcome is Outcome.TIMEOUT


def test_the_estimate_follows_a_slowdown_fast_and_forgets_it_slowly():
    times = ServiceTimes()
    for _ in range(50):
        times.observe(100, 0.010)
    assert abs(times.healthy_s(100) - 0.010) < 1e-9
    for _ in range(5):
        times.observe(100, 0.100)
    assert times.healthy_s(100) > 0.07  # five slow answers raise it most of the way
    for _ in range(20):
        times.observe(100, 0.010)
    assert times.healthy_s(100) > 0.05  # and twenty fast ones do not undo it


def test_the_estimate_settles_near_a_high_quantile():
    times = ServiceTimes()
    # 95 % of answers at 10 ms, 5 % at 30 ms, interleaved
    for i in range(4000):
        times.observe(100, 0.030 if i % 20 == 0 else 0.010)
    assert 0.012 < times.healthy_s(100) < 0.030


def test_an_unseen_size_borrows_from_smaller_requests_only():
    times = ServiceTimes()
    assert times.healthy_s(1000) == 0.0
    times.observe(100, 0.02)
    assert times.healthy_s(1000) == 0.02  # a larger request is never faster
    assert times.healthy_s(10) == 0.0  # a smaller one may be
    assert times.deadline_counts(1000, 0.05, floor_s=0.1) is False  # under the floor
    assert times.deadline_counts(1000, 0.01, floor_s=0.0) is False  # under the estimate
    assert times.deadline_counts(1000, 0.02, floor_s=0.0) is True
