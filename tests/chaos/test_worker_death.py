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


async def _kill_one_under_load(process) -> dict:
    async with async_client(process.url) as client:
        rows = await process.replicas_async(client)
        victim = rows[0]

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
        row = await wait_until(restarted, 40, "the killed replica restarts and is ready")
        recovery_s = time.monotonic() - started
        after = [await one_request(client, 1000 + i, deadline_ms=DEADLINE_MS) for i in range(12)]
    return {"results": results, "victim": victim, "row": row, "after": after, "rec": recovery_s}


@pytest.fixture(scope="module")
def killed_one(tmp_path_factory, tiny_model_dir):
    """One run of the scenario, shared by the hard checks and the retry expectation."""
    from tests.chaos.harness import ServeProcess, deployment_config, wait_gone

    workdir = tmp_path_factory.mktemp("chaos-kill-one")
    process = ServeProcess(workdir, deployment_config(tiny_model_dir, 2))
    try:
        process.start()
        outcome = trio.run(_kill_one_under_load, process)
    finally:
        process.stop()
    assert not wait_gone(process.seen_pids), "worker processes outlived sr serve"
    outcome["row_report"] = report(
        "sigkill_one_of_two",
        outcome["results"],
        replica_restarted=True,
        restart_to_ready_s=round(outcome["rec"], 1),
    )
    return outcome


def test_sigkill_one_of_two_every_answer_documented_and_the_replica_returns(killed_one):
    results = killed_one["results"]
    assert undocumented(results) == [], counts(results)
    assert set(counts(results)) <= {"ok", "worker_failed", "unavailable"}, counts(results)
    assert max(r.latency_s for r in results) < DEADLINE_MS / 1000 + CLIENT_SLACK_S
    # the survivor kept serving: most of the run succeeded
    assert counts(results).get("ok", 0) >= len(results) - 12
    # the restarted replica serves again
    after = killed_one["after"]
    assert [r.code for r in after] == ["ok"] * len(after)
    assert killed_one["victim"]["id"] in {r.replica for r in after}


@pytest.mark.xfail(
    strict=False,
    reason="the pool does not yet retry a request whose worker died before answering "
    "(sr/pool/deployment.py DeploymentPool.request_raw); see docs/reliability.md",
)
def test_sigkill_one_of_two_costs_no_client_error(killed_one):
    results = killed_one["results"]
    assert counts(results) == {"ok": len(results)}


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
