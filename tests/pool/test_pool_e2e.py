"""Real worker processes (tiny model): restart after SIGKILL, reload keeps pids, in-process."""

from __future__ import annotations

import os
import signal

import pytest
import trio

from sr.config.schema import Deployment, Replica, SrConfig
from sr.events import RecordingSink
from sr.pool import open_router

pytestmark = pytest.mark.e2e


def tiny_config(model_dir, n: int) -> SrConfig:
    cfg = SrConfig()
    cfg.deployments["tiny"] = Deployment(
        artifact=str(model_dir), replicas=[Replica(device="cpu")] * n
    )
    return cfg


async def wait_until(predicate, timeout_s: float) -> None:
    with trio.fail_after(timeout_s):
        while not predicate():
            await trio.sleep(0.05)


def rows(core):
    return core.inventory().deployments["tiny"].replicas


async def embed(core) -> str:
    reply = await core.request_raw("tiny", "/v1/embeddings", b'{"input": "hello"}', timeout_s=10)
    assert reply.status == 200, reply.body
    return reply.replica_id


async def test_sigkilled_worker_is_restarted_while_the_other_serves(tiny_model_dir, tmp_path):
    sink = RecordingSink()
    async with open_router(
        tiny_config(tiny_model_dir, 2), events=sink, threads=1, run_dir=tmp_path / "run"
    ) as core:
        await core.wait_ready(30)
        await wait_until(lambda: all(r.ready for r in rows(core)), 30)
        victim, survivor = rows(core)
        os.kill(victim.pid, signal.SIGKILL)
        await wait_until(lambda: rows(core)[0].state.value == "restarting", 5)
        assert rows(core)[0].reason.startswith("killed by SIGKILL; restarting in ")
        answered = set()
        with trio.fail_after(30):
            while rows(core)[0].state.value != "ready":  # the survivor answers meanwhile
                answered.add(await embed(core))
                await trio.sleep(0.1)
        assert answered == {survivor.id}
        restarted = rows(core)[0]
        assert restarted.restarts == 1 and restarted.pid not in (None, victim.pid)
        assert rows(core)[1].pid == survivor.pid
        assert core.inventory().deployments["tiny"].restarts == 1
        assert [e["replica"] for e in sink.named("replica_restarted")] == [victim.id]


async def test_reload_from_two_to_three_keeps_the_first_two_pids(tiny_model_dir, tmp_path):
    async with open_router(
        tiny_config(tiny_model_dir, 2), threads=1, run_dir=tmp_path / "run"
    ) as core:
        await core.wait_ready(30)
        await wait_until(lambda: all(r.ready for r in rows(core)), 30)
        pids = [r.pid for r in rows(core)]
        await core.reload(tiny_config(tiny_model_dir, 3), timeout_s=30)
        after = rows(core)
        assert [r.pid for r in after[:2]] == pids
        assert len(after) == 3 and after[2].ready and after[2].pid not in pids
        assert len({await embed(core) for _ in range(3)}) == 3  # idle: one each


async def test_in_process_replicas_serve_real_embeddings(tiny_model_dir, tmp_path):
    async with open_router(
        tiny_config(tiny_model_dir, 2), in_process=True, threads=1, run_dir=tmp_path / "run"
    ) as core:
        await core.wait_ready(30)
        answer = await core.request("tiny", "/v1/embeddings", {"input": ["a", "b"]})
        assert [d["index"] for d in answer["data"]] == [0, 1]
        assert all(r.pid is None for r in rows(core))


async def test_attached_replica_is_probed_never_started(tmp_path):
    cfg = SrConfig()
    cfg.deployments["remote"] = Deployment(
        artifact="a", replicas=[Replica(endpoint="http://127.0.0.1:9", model="a")]
    )
    async with open_router(cfg, threads=1, run_dir=tmp_path / "run") as core:
        with trio.fail_after(5):
            while core.inventory().deployments["remote"].replicas[0].state.value != "unreachable":
                await trio.sleep(0.05)
        row = core.inventory().deployments["remote"].replicas[0]
        assert row.pid is None and row.endpoint == "http://127.0.0.1:9"
        assert row.device is None and row.reason
