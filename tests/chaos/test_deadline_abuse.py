"""Impossible deadlines from one caller cost other callers nothing: a 1 ms
`X-Request-Timeout-Ms` flood answers 504 to its sender, and neither backs off nor ejects
any replica (sr.pool.service_times); a replica that truly hangs is still ejected by the
deadlines of callers a healthy replica answers in time."""

from __future__ import annotations

import os
import signal
import time

import pytest
import trio

from tests.chaos.harness import async_client, counts, one_request, report, wait_until
from tests.serve_process import set_fault_async

pytestmark = pytest.mark.chaos

FLOOD_LANES = 4


async def _flood(client, stop: trio.Event, tally: list) -> None:
    """1 ms deadlines, back to back, until `stop`."""

    async def lane(offset: int) -> None:
        index = offset
        while not stop.is_set():
            tally.append(await one_request(client, index, deadline_ms=1, client_timeout_s=5))
            index += FLOOD_LANES

    async with trio.open_nursery() as nursery:
        for offset in range(FLOOD_LANES):
            nursery.start_soon(lane, offset)


async def test_a_flood_of_1ms_deadlines_leaves_other_callers_without_errors(serve):
    process = serve(2)
    flood: list = []
    normal: list = []
    async with async_client(process.url) as attacker, async_client(process.url) as client:
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_flood, attacker, stop, flood)
            with trio.fail_after(60):
                for i in range(60):
                    normal.append(await one_request(client, i, deadline_ms=None))
            stop.set()
        rows = await process.replicas_async(client)
    flood_tally = counts(flood)
    assert flood_tally.get("timeout", 0) >= 20, flood_tally  # the flood did reach the pool
    assert set(flood_tally) <= {"ok", "timeout"}, flood_tally
    assert counts(normal) == {"ok": len(normal)}
    assert process.events("replica_ejected") == []
    assert {r["state"] for r in rows} == {"ready"}, rows
    assert all(r["consecutive_timeouts"] == 0 for r in rows), rows
    report("deadline_flood", normal, flood=flood_tally)


async def _while_flooded(process, body) -> None:
    """Run `body(client)` while another client floods 1 ms deadlines."""
    async with async_client(process.url) as attacker, async_client(process.url) as client:
        stop = trio.Event()
        flood: list = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_flood, attacker, stop, flood)
            try:
                await body(client)
            finally:
                stop.set()


async def test_a_hung_replica_is_still_ejected_by_deadlines_it_should_meet(serve):
    deadline_ms = 1000
    process = serve(2, outlier={"base_ejection_ms": 20_000})
    results: list = []
    took: list[float] = []

    async def body(client) -> None:
        victim = (await process.replicas_async(client))[0]
        for i in range(10):  # healthy answers: the pool learns their service time
            assert (await one_request(client, i, deadline_ms=deadline_ms)).code == "ok"
        await set_fault_async(victim["pid"], "hang")  # /health still answers
        hung_at = time.monotonic()

        async def ejected() -> bool:
            results.append(await one_request(client, 100, deadline_ms=deadline_ms))
            return any(e["replica"] == victim["id"] for e in process.events("replica_ejected"))

        # Three timeouts of 1 s each, with the 0.1 s and 0.2 s backoffs between them.
        await wait_until(ejected, 3 * deadline_ms / 1000 + 3, "ejection", poll_s=0)
        took.append(time.monotonic() - hung_at)
        await set_fault_async(victim["pid"], "none")

    await _while_flooded(process, body)
    tally = counts(results)
    assert set(tally) <= {"ok", "timeout"} and tally.get("timeout", 0) >= 3, tally
    report("deadline_flood_hung_forward", results, ejected_after_s=round(took[0], 2))


async def test_a_stopped_replica_still_leaves_dispatch_under_the_flood(serve):
    deadline_ms = 1000
    process = serve(2)
    results: list = []

    async def body(client) -> None:
        victim = (await process.replicas_async(client))[0]
        os.kill(victim["pid"], signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            with trio.fail_after(30):
                for i in range(60):
                    results.append(await one_request(client, i, deadline_ms=deadline_ms))
                    await trio.sleep(0.05)
        finally:
            os.kill(victim["pid"], signal.SIGCONT)
        # once the probes found it unreachable (within 3 s), every request is answered
        tail = [r for r in results if r.started > stopped_at + 3.0]
        assert len(tail) >= 20 and {r.code for r in tail} == {"ok"}, counts(tail)
        assert victim["id"] not in {r.replica for r in tail}

    await _while_flooded(process, body)
    assert set(counts(results)) <= {"ok", "timeout"}, counts(results)
    report("deadline_flood_sigstop", results)
