"""Supervisor.replica_metrics over in-process workers (InProcessTransport): each connected
replica's text, in parallel, bounded, and outside dispatch."""

from __future__ import annotations

import itertools
import json

import trio

from sr.config.schema import Deployment, Replica, SrConfig
from sr.events import RecordingSink
from sr.http.hop import NO_HOP
from sr.pool import open_router
from sr.worker.service import WorkerService
from tests.metrics_text import samples
from tests.worker.worker_fakes import FakeModel, fake_service_kwargs

SCRAPE_TIMEOUT_S = 0.3
# Zero-shot: two inputs and two label descriptions, four rows in one forward.
CLASSIFY = json.dumps(
    {"model": "/models/fake", "input": ["a b", "c"], "labels": {"yes": "agree", "no": "nay"}}
).encode()


class StuckScrapes:
    """A worker whose /metrics never answers (a wedged event loop, say); all else works."""

    def __init__(self, service: WorkerService) -> None:
        self.service = service
        self.scrapes_started = 0

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await self.service.run(task_status=task_status)

    async def handle(self, method, path, body, hop=NO_HOP):
        if path == "/metrics":
            self.scrapes_started += 1
            await trio.sleep_forever()
        return await self.service.handle(method, path, body, hop)


def two_workers_one_stuck():
    made = itertools.count()
    stuck: list[StuckScrapes] = []

    def factory(options):
        service = WorkerService(options, **fake_service_kwargs(FakeModel()))
        if next(made) == 0:
            return service
        stuck.append(StuckScrapes(service))
        return stuck[0]

    return factory, stuck


async def test_connected_replicas_are_scraped_in_parallel_outside_dispatch(tmp_path):
    config = SrConfig()
    config.deployments["primary"] = Deployment(
        artifact="/models/fake", replicas=[Replica(device="cpu"), Replica(device="cpu")]
    )
    factory, stuck = two_workers_one_stuck()
    with trio.fail_after(20):
        async with open_router(
            config, events=RecordingSink(), in_process=True, threads=1,
            run_dir=tmp_path / "run", worker_factory=factory,
        ) as core:  # fmt: skip
            while core.inventory().deployments["primary"].ready_replicas < 2:
                await trio.sleep(0.02)
            for _ in range(2):  # least-recently-assigned: one request each
                assert (await core.request_raw("primary", "/v1/classify", CLASSIFY)).status == 200
            result: list = []
            async with trio.open_nursery() as nursery:

                async def scrape() -> None:
                    result.extend(await core.replica_metrics(SCRAPE_TIMEOUT_S))

                started = trio.current_time()
                nursery.start_soon(scrape)
                while not stuck[0].scrapes_started:
                    await trio.sleep(0.01)
                # In flight, yet not a request: dispatch sees no load on either replica.
                rows = core.inventory().deployments["primary"].replicas
                assert [(r.inflight, r.outstanding_bytes) for r in rows] == [(0, 0)] * 2
                replica_ids = {r.id for r in rows}
            elapsed = trio.current_time() - started
    assert SCRAPE_TIMEOUT_S <= elapsed < SCRAPE_TIMEOUT_S + 1.0  # bounded, not serial
    by_replica = {scrape.replica: scrape for scrape in result}
    assert set(by_replica) == replica_ids
    assert {scrape.deployment for scrape in result} == {"primary"}
    answered = [scrape for scrape in result if scrape.text is not None]
    assert len(answered) == 1
    found = samples(answered[0].text)
    assert found[("sr_worker_forwards_total", ())] == 1
    assert found[("sr_worker_batch_rows_sum", ())] == 4  # two inputs and two label texts
