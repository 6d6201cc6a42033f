"""Workers that stop answering: SIGSTOP (nothing answers) and hung forwards (/health fine)."""

from __future__ import annotations

import os
import signal
import time

import pytest
import trio

from tests.chaos.harness import (
    async_client,
    counts,
    one_request,
    report,
    steady_load,
    undocumented,
    wait_until,
)
from tests.serve_process import set_fault_async

pytestmark = pytest.mark.chaos


async def test_sigstop_times_out_backs_off_then_sigcont_returns(serve):
    timeout_ms = 400
    process = serve(2, timeout_ms=timeout_ms, outlier={"base_ejection_ms": 1000})
    async with async_client(process.url) as client:
        victim = (await process.replicas_async(client))[0]
        stopped_at: list[float] = []

        async def stop_at(index: int) -> None:
            if index == 20:
                os.kill(victim["pid"], signal.SIGSTOP)
                stopped_at.append(time.monotonic())

        try:
            with trio.fail_after(60):
                results = await steady_load(
                    client, 160, 4, deadline_ms=None, on_sent=stop_at, pace_s=0.1
                )
        finally:
            os.kill(victim["pid"], signal.SIGCONT)
        resumed_at = time.monotonic()
        tally = counts(results)
        assert undocumented(results) == [], tally
        assert set(tally) <= {"ok", "timeout"}, tally
        assert tally.get("timeout", 0) >= 1, "a request dispatched to the stopped worker"
        # every timeout came at the deployment's deadline, not later
        assert max(r.latency_s for r in results) < timeout_ms / 1000 + 1.0
        # the pool stopped sending to it: once the probes saw it unreachable, all ok
        settle_s = 3.0
        tail = [r for r in results if r.started > stopped_at[0] + settle_s]
        assert len(tail) >= 40, "the load outlasted the settling time"
        assert {r.code for r in tail} == {"ok"}, counts(tail)
        assert victim["id"] not in {r.replica for r in tail}

        async def back():
            rows = {r["id"]: r for r in await process.replicas_async(client)}
            return rows[victim["id"]]["state"] == "ready"

        await wait_until(back, 15, "SIGCONT: the replica is ready again")
        returned_s = time.monotonic() - resumed_at
        after = [await one_request(client, 1000 + i, deadline_ms=None) for i in range(8)]
        assert [r.code for r in after] == ["ok"] * 8
        assert victim["id"] in {r.replica for r in after}
        assert victim["pid"] in [r["pid"] for r in await process.replicas_async(client)]
    report(
        "sigstop_then_sigcont",
        results + after,
        timeouts_before_routed_away=tally.get("timeout", 0),
        ready_after_sigcont_s=round(returned_s, 1),
    )


async def test_hung_forwards_eject_readmit_and_double(serve):
    base_ms = 1500
    process = serve(
        3,
        timeout_ms=300,
        outlier={"consecutive_timeouts": 3, "base_ejection_ms": base_ms, "max_ejection_ms": 20000},
    )
    async with async_client(process.url) as client:
        victim = (await process.replicas_async(client))[0]
        await set_fault_async(victim["pid"], "hang")
        results: list = []

        async def drive_until(check, limit_s: float, what: str) -> None:
            """Keep 3 lanes of requests going until `check()` holds."""
            with trio.move_on_after(limit_s) as scope:
                while not check():
                    results.extend(
                        await steady_load(client, 3, 3, deadline_ms=None, client_timeout_s=5)
                    )
            assert not scope.cancelled_caught, f"not within {limit_s}s: {what}"

        def ejections() -> list[dict]:
            return [e for e in process.events("replica_ejected") if e["replica"] == victim["id"]]

        await drive_until(lambda: len(ejections()) >= 1, 15, "the hung replica is ejected")
        first_ejected_at = time.monotonic()
        row = {r["id"]: r for r in await process.replicas_async(client)}[victim["id"]]
        assert row["state"] == "ejected", row
        assert row["ejections"] == 1 and 0 < row["ejected_for_ms"] <= base_ms
        assert row["pid"] == victim["pid"]  # /health was fine: no restart, no backoff loop

        # while ejected, the others serve everything
        during = await steady_load(client, 18, 3, deadline_ms=None, client_timeout_s=5)
        results.extend(during)
        assert time.monotonic() - first_ejected_at < base_ms / 1000, "check ran in the window"
        assert [r.code for r in during] == ["ok"] * len(during), counts(during)
        assert victim["id"] not in {r.replica for r in during}

        def readmitted() -> bool:
            return any(
                e["replica"] == victim["id"] and e.get("reason") == "cooldown"
                for e in process.events("replica_readmitted")
            )

        async def cooled():
            return readmitted()

        await wait_until(cooled, base_ms / 1000 + 3, "readmission after the cooldown")
        # on probation: its next timeout ejects it again, for twice as long
        await drive_until(lambda: len(ejections()) >= 2, 10, "the second ejection")
        await set_fault_async(victim["pid"], "none")
    durations = [e["duration_ms"] for e in ejections()]
    assert durations[:2] == [base_ms, 2 * base_ms], ejections()
    tally = counts(results)
    assert undocumented(results) == [], tally
    assert set(tally) <= {"ok", "timeout"}, tally
    # only requests that reached the hung replica timed out: 3 to eject, 1 on probation,
    # plus the few dispatched to it concurrently before an outcome was known
    assert 4 <= tally.get("timeout", 0) <= 10, tally
    report(
        "hung_forwards_ejection",
        results,
        ejection_ms=durations[:2],
        readmitted="cooldown",
    )
