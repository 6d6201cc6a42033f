"""Admission under 3x the cap, and a router SIGTERM with requests in flight."""

from __future__ import annotations

import signal
import time

import pytest
import trio

from tests.chaos.harness import (
    async_client,
    counts,
    one_request,
    report,
    undocumented,
)
from tests.serve_process import set_fault_async, wait_gone

pytestmark = pytest.mark.chaos

ADMISSION_CAP = 32  # a worker admits 32 in-flight HTTP requests; the excess gets 503 overloaded


async def _burst(client, total: int, *, client_timeout_s: float) -> list:
    results: list = []

    async def one(index: int) -> None:
        results.append(
            await one_request(client, index, deadline_ms=None, client_timeout_s=client_timeout_s)
        )

    async with trio.open_nursery() as nursery:
        for index in range(total):
            nursery.start_soon(one, index)
    return sorted(results, key=lambda r: r.index)


async def test_three_times_the_cap_excess_is_overloaded_at_once(serve):
    slow_ms = 2500
    process = serve(1)
    async with async_client(process.url, connections=4 * ADMISSION_CAP) as client:
        (row,) = await process.replicas_async(client)
        await set_fault_async(row["pid"], "slow", slow_ms)
        try:
            results = await _burst(client, 3 * ADMISSION_CAP, client_timeout_s=15)
        finally:
            await set_fault_async(row["pid"], "none")
    tally = counts(results)
    assert undocumented(results) == [], tally
    assert tally == {"ok": ADMISSION_CAP, "overloaded": 2 * ADMISSION_CAP}, tally
    refused = [r for r in results if r.code == "overloaded"]
    assert all(r.status == 503 and r.retry_after and int(r.retry_after) >= 1 for r in refused)
    # at once: long before any admitted request could finish
    assert max(r.latency_s for r in refused) < slow_ms / 2000
    assert min(r.latency_s for r in results if r.code == "ok") >= slow_ms / 1000
    report(
        "overload_3x_cap",
        results,
        overloaded_max_latency_ms=round(max(r.latency_s for r in refused) * 1000),
        slow_ms=slow_ms,
    )


async def test_sigterm_under_load_finishes_in_flight_and_leaves_no_worker(serve):
    slow_ms = 1500
    process = serve(2)
    async with async_client(process.url) as client:
        rows = await process.replicas_async(client)
        pids = [r["pid"] for r in rows]
        for pid in pids:
            await set_fault_async(pid, "slow", slow_ms)
        results: list = []
        signalled_at: list[float] = []

        async def one(index: int) -> None:
            results.append(await one_request(client, index, deadline_ms=None, client_timeout_s=20))

        async with trio.open_nursery() as nursery:
            for index in range(24):
                nursery.start_soon(one, index)

            async def inflight() -> int:
                return sum(r["inflight"] for r in await process.replicas_async(client))

            with trio.fail_after(5):
                while await inflight() < 24:
                    await trio.sleep(0.02)
            process.signal(signal.SIGTERM)
            signalled_at.append(time.monotonic())
    exit_code = await trio.to_thread.run_sync(lambda: process.wait(30))
    stopped_s = time.monotonic() - signalled_at[0]
    survivors = wait_gone(pids)
    tally = counts(results)
    assert exit_code == 0, process.logs()
    assert tally == {"ok": 24}, (tally, process.logs())
    assert not survivors, f"workers outlived sr serve: {survivors}"
    report(
        "sigterm_under_load",
        results,
        router_exit=exit_code,
        workers_left=len(survivors),
        stop_s=round(stopped_s, 1),
    )
