"""A fake Supervisor: the pool interface the front end uses, with scripted answers."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from sr.config.schema import Deployment, Replica, SrConfig
from sr.errors import ModelNotFound, SrError
from sr.http.body import ClientDisconnected
from sr.pool.state import ReplicaState
from sr.pool.views import DeploymentView, Inventory, ReplicaView


@attrs.define
class FakeReply:
    status: int
    headers: dict[str, str]
    body: bytes
    replica_id: str


Handler = Callable[[str, str, bytes, float | None], Awaitable[FakeReply]]


async def echo_embeddings(deployment: str, path: str, body: bytes, timeout_s: float | None):
    """Answer like a worker (sr.worker.served_as): the model the request named, else the
    artifact (make_config's), and a fixed embedding."""
    request = json.loads(body)
    answer = {
        "object": "list",
        "model": request.get("model", f"/models/{deployment}"),
        "data": [{"object": "embedding", "index": 0, "embedding": [0.25, -0.5]}],
        "usage": {"prompt_tokens": 3, "total_tokens": 3},
    }
    return FakeReply(200, {}, json.dumps(answer).encode(), f"{deployment}-0")


def make_config(replicas: dict[str, int], api_keys: list[str] | None = None) -> SrConfig:
    config = SrConfig()
    for name, count in replicas.items():
        config.deployments[name] = Deployment(
            artifact=f"/models/{name}", replicas=[Replica(device="cpu") for _ in range(count)]
        )
    config.listeners[0].api_keys = list(api_keys or [])
    return config


class FakeRouterCore:
    def __init__(self, config: SrConfig, handler: Handler = echo_embeddings, events=None):
        self.config = config
        self.handler = handler
        self.events = events
        self.calls: list[tuple[str, str, bytes, float | None]] = []
        self.ready = True
        self.replica_states: dict[str, str] = {}  # replica id -> state, overriding ready
        self.reloads: list[SrConfig] = []
        self.reload_error: Exception | None = None
        self.reloading = False  # Supervisor.reloading: a reload from elsewhere runs
        self.wait_ready_error: SrError | None = None
        self.replica_scrapes: list = []
        self.request_ids: list[str | None] = []
        self.scrape_timeouts: list[float] = []

    def resolve(self, model: str) -> str:
        for name, deployment in self.config.deployments.items():
            if model in (name, deployment.artifact):
                return name
        raise ModelNotFound(f"model {model!r} is not a deployment or its artifact")

    async def request_raw(
        self, deployment, path, body, timeout_s=None, request_id=None, watch=None, trace=None
    ):
        self.calls.append((deployment, path, body, timeout_s))
        self.request_ids.append(request_id)
        if watch is None:
            return await self.handler(deployment, path, body, timeout_s)
        # As the pool does: the hang-up watch cancels the dispatch's own scope, and the
        # dispatch says so with ClientDisconnected.
        with trio.CancelScope() as scope:
            stop_watching = watch(scope)
            try:
                return await self.handler(deployment, path, body, timeout_s)
            finally:
                stop_watching()
        raise ClientDisconnected("the caller hung up")

    def served_dtype(self, deployment: str) -> str | None:
        """No replica cards here: `sr_model_info` labels the configured dtype."""
        return None

    def model_card(self, deployment: str) -> dict | None:
        """No replica cards here."""
        return None

    def inventory(self) -> Inventory:
        deployments = {}
        for name, deployment in self.config.deployments.items():
            replicas = tuple(
                ReplicaView(
                    id=f"{name}-{i}",
                    device="cpu",
                    endpoint=None,
                    state=ReplicaState(
                        self.replica_states.get(f"{name}-{i}", "ready" if self.ready else "loading")
                    ),
                    ready=self.ready and f"{name}-{i}" not in self.replica_states,
                    inflight=i,
                    outstanding_bytes=100 * i,
                    restarts=0,
                    consecutive_timeouts=0,
                    ejections=0,
                    threads=1,
                    pid=None,
                    reason=None,
                )
                for i in range(len(deployment.placements()))
            )
            deployments[name] = DeploymentView(
                artifact=deployment.artifact,
                desired_replicas=len(replicas),
                ready_replicas=len(replicas) if self.ready else 0,
                state="ready" if self.ready else "starting",
                restarts=0,
                replicas=replicas,
            )
        return Inventory(ready=self.ready, deployments=deployments)

    async def replica_metrics(self, timeout_s: float) -> list:
        """The scripted scrapes (sr.pool.supervisor.ReplicaScrape values); none by default."""
        self.scrape_timeouts.append(timeout_s)
        return list(self.replica_scrapes)

    def is_ready(self) -> bool:
        return self.ready

    async def wait_ready(self, timeout_s=None) -> None:
        if self.wait_ready_error is not None:
            raise self.wait_ready_error
        while not self.ready:
            await trio.sleep(0.01)

    async def reload(self, new_config: SrConfig):
        if self.reload_error is not None:
            raise self.reload_error
        self.reloads.append(new_config)
        self.config = new_config
        return None


def fake_open_router(core_holder: list[FakeRouterCore], make: Callable[[SrConfig], Any]):
    """An `open_router` replacement that records the core it made."""

    @asynccontextmanager
    async def open_router(config, *, events=None, in_process=False, threads=None, settings=None):
        core = make(config)
        core.events = events
        core_holder.append(core)
        yield core

    return open_router
