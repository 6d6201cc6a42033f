"""Exchanges with one worker outside dispatch: what operators and scrapes send a worker.

Rules: these go straight over a replica's transport, never through dispatch, so they hold
no outstanding bytes, record no outcome and can never eject a replica. Each is bounded in
time by its caller's `timeout_s`. A replica without a connection (starting, stopped) has no
worker to ask: a scrape leaves it out, a post is `Unavailable`.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import trio

from sr.errors import DeadlineExceeded, ModelNotFound, ReplicaNotFound, Unavailable, WorkerFailed
from sr.pool.deployment import DeploymentPool
from sr.pool.transport import Transport, TransportError


@attrs.frozen
class WorkerAnswer:
    """A worker's answer to `Supervisor.post_to_worker`, and which replica and process gave it."""

    replica: str
    pid: int | None
    status: int
    body: bytes


@attrs.frozen
class ReplicaScrape:
    """One replica's answer to GET /metrics: its Prometheus text, or None when it gave
    no 200 within the scrape's timeout."""

    deployment: str
    replica: str
    text: str | None


async def scrape_metrics(
    pools: Mapping[str, DeploymentPool], timeout_s: float
) -> list[ReplicaScrape]:
    """GET /metrics of every replica that has a connection, in parallel, each bounded
    by `timeout_s`. Straight over the transport, not through dispatch: a scrape is not
    a request (no outstanding bytes, no outcome, no ejection). Replicas without a
    connection (starting, stopped) are left out."""
    targets = [
        (name, replica_id, runner.transport)
        for name, pool in pools.items()
        for replica_id, runner in pool.runners.items()
        if runner.transport is not None
    ]
    texts: list[str | None] = [None] * len(targets)

    async def scrape(index: int, transport: Transport) -> None:
        with trio.move_on_after(timeout_s):
            try:
                status, _, body = await transport.exchange("GET", "/metrics")
            except TransportError:
                return
            if status == 200:
                texts[index] = body.decode("utf-8", "replace")

    async with trio.open_nursery() as nursery:
        for index, (_, _, transport) in enumerate(targets):
            nursery.start_soon(scrape, index, transport)
    return [
        ReplicaScrape(name, replica_id, text)
        for (name, replica_id, _), text in zip(targets, texts, strict=True)
    ]


async def post_to_worker(
    pools: Mapping[str, DeploymentPool],
    deployment: str,
    replica: str | int,
    path: str,
    body: bytes,
    *,
    timeout_s: float,
) -> WorkerAnswer:
    """POST `body` to `path` on the worker of one published replica of `deployment` (its
    id, or its 0-based index in declared order), bounded by `timeout_s`: for operator
    routes (fault injection, sr.router.faults). Like a metrics scrape it bypasses
    dispatch. ModelNotFound, ReplicaNotFound, Unavailable (no worker connection),
    WorkerFailed (the exchange broke) or DeadlineExceeded."""
    pool = pools.get(deployment)
    if pool is None:
        known = sorted(pools)
        raise ModelNotFound(f"deployment {deployment!r} does not exist; known: {known}")
    ids = list(pool.runners)
    if isinstance(replica, int):
        if replica >= len(ids):
            raise ReplicaNotFound(
                f"replica: index {replica} is out of range; {deployment!r} has {len(ids)}"
            )
        replica_id = ids[replica]
    elif replica in pool.runners:
        replica_id = replica
    else:
        raise ReplicaNotFound(f"replica: {replica!r} is not a replica of {deployment!r}: {ids}")
    runner = pool.runners[replica_id]
    transport = runner.transport
    if transport is None:
        raise Unavailable(f"replica {replica_id} has no running worker to configure")
    pid = runner.record.pid
    with trio.move_on_after(timeout_s):
        try:
            status, _, answer = await transport.exchange("POST", path, body)
        except Exception as error:  # TransportError or anything the socket throws
            raise WorkerFailed(f"replica {replica_id}: {type(error).__name__}") from None
        return WorkerAnswer(replica_id, pid, status, answer)
    raise DeadlineExceeded(f"replica {replica_id} did not answer {path} within {timeout_s:g}s")
