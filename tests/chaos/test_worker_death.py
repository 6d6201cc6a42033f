"""Workers killed under load: nothing hangs, every answer is documented, the pool heals."""

from __future__ import annotations

import os
import signal
import time

import pytest
import trio

from tests.chaos.harness import (
    CLIENT_SLACK_S,
    async_client,
    counts,
    one_request,
    report,
    steady_load,
    undocumented,
    wait_until,
)

pytestmark = pytest.mark.chaos

DEADLINE_MS = 5000


async def test_sigkill_one_of_two_under_load_costs_no_client_error(serve):
    """In-flight requests on the killed worker are retried once on the survivor (the pool's
    retry of a request that got no HTTP answer), so callers see no error at all."""
    process = serve(2)
    async with async_client(process.url) as client:
        victim = (await process.replicas_async(client))[0]

        async def kill_at(index: int) -> None:
            if index == 40:
                os.kill(victim["pid"], signal.SIGKILL)

        with trio.fail_after(60):
            results = await steady_load(
                client, 160, 6, deadline_ms=DEADLINE_MS, on_sent=kill_at, pace_s=0.01
            )

        async def restarted():
            rows = {r["id"]: r for r in await process.replicas_async(client)}
            row = rows[victim["id"]]
            fresh = row["state"] == "ready" and row["pid"] not in (None, victim["pid"])
            return row if fresh and row["restarts"] >= 1 else None

        started = time.monotonic()
        await wait_until(restarted, 40, "the killed replica restarts and is ready")
        recovery_s = time.monotonic() - started
        after = [await one_request(client, 1000 + i, deadline_ms=DEADLINE_MS) for i in range(12)]
    assert undocumented(results) == [], counts(results)
    assert max(r.latency_s for r in results) < DEADLINE_MS / 1000 + CLIENT_SLACK_S
    assert counts(results) == {"ok": len(results)}
    # the restarted replica serves again
    assert [r.code for r in after] == ["ok"] * len(after)
    assert victim["id"] in {r.replica for r in after}
    report(
        "sigkill_one_of_two",
        results,
        replica_restarted=True,
        restart_to_ready_s=round(recovery_s, 1),
    )


async def test_kill_every_worker_unavailable_at_once_then_recovers(serve):
    process = serve(2)
    async with async_client(process.url) as client:
        rows = await process.replicas_async(client)
        for row in rows:
            os.kill(row["pid"], signal.SIGKILL)

        async def none_ready():
            return all(not r["ready"] for r in await process.replicas_async(client))

        await wait_until(none_ready, 5, "the pool notices both workers are gone")
        outage = [await one_request(client, i, deadline_ms=DEADLINE_MS) for i in range(10)]
        assert [r.code for r in outage] == ["unavailable"] * 10, counts(outage)
        # "at once": an unavailable deployment answers without waiting for its deadline
        assert max(r.latency_s for r in outage) < 0.5

        recovery: list = []
        started = time.monotonic()

        async def serving():
            result = await one_request(client, 100 + len(recovery), deadline_ms=DEADLINE_MS)
            recovery.append(result)
            return result.code == "ok"

        await wait_until(serving, 45, "requests succeed again without operator action", 0.2)
        recovered_s = time.monotonic() - started
    results = outage + recovery
    assert undocumented(results) == [], counts(results)
    assert set(counts(results)) <= {"ok", "unavailable", "worker_failed"}
    report(
        "kill_every_worker",
        results,
        unavailable_max_latency_ms=round(max(r.latency_s for r in outage) * 1000),
        recovery_s=round(recovered_s, 1),
    )
