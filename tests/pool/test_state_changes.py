"""StateChanges (sr.pool.changes) under a mock clock: a waiter resumes at the virtual
instant of the change that satisfies it, never on a later tick."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from sr.pool.changes import StateChanges
from sr.pool.outcome import Outcome


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


async def test_a_waiter_resumes_at_the_instant_of_the_change(autojump_clock):
    changes = StateChanges()
    state = {"value": 0}
    woke: list[float] = []

    async def waiter() -> None:
        await changes.wait_until(lambda: state["value"] >= 2)
        woke.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.sleep(1.2345)
        state["value"] = 1  # not enough: the waiter re-checks and waits on
        changes.notify()
        await trio.sleep(0.6789)
        assert woke == []
        state["value"] = 2
        changes.notify()
    assert woke == [pytest.approx(1.2345 + 0.6789, abs=0)]


async def test_a_true_predicate_returns_at_once_and_a_notify_without_waiters_is_free(
    autojump_clock,
):
    changes = StateChanges()
    changes.notify()
    assert changes._event is None  # nothing allocated when nobody waits
    await changes.wait_until(lambda: True)
    assert trio.current_time() == 0


async def test_a_wait_is_bounded_by_its_cancel_scope(autojump_clock):
    changes = StateChanges()
    with trio.move_on_after(3) as scope:
        await changes.wait_until(lambda: False)
    assert scope.cancelled_caught and trio.current_time() == 3


async def test_a_drain_ends_at_the_instant_the_last_request_is_released(
    make_policy, autojump_clock
):
    policy, records, _ = make_policy(1)
    rec = records[0]
    first, second = policy.reserve(10, 0.0), policy.reserve(10, 0.0)
    drained: list[float] = []

    async def drain() -> None:
        await policy.changes.wait_until(lambda: rec.inflight == 0)
        drained.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain)
        await trio.sleep(0.3141)
        policy.release(first, Outcome.OK, trio.current_time())
        await trio.sleep(0.2718)
        assert drained == []
        policy.release(second, Outcome.OK, trio.current_time())
    assert drained == [pytest.approx(0.3141 + 0.2718, abs=0)]
