"""A fleet across "hosts" on this machine: real `sr worker` processes bound to 127.0.0.2,
.3 and .4 (loopback addresses standing for hosts), each wanting an API key, and a router
(`sr.serve`, over HTTP) whose `discover` entry resolves through a resolver the test
controls. Under a bounded load of concurrent clients:

* SIGKILL one host's worker: no client sees an error (the one retry);
* the worker comes back on the same address: the same replica is readmitted;
* a fourth address (127.0.0.5) added to the resolver joins without a router restart;
* an address removed from the resolver is drained and forgotten.
"""

from __future__ import annotations

import functools
import io
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
import trio

from sr.config.schema import Deployment, Listener, Replica, SrConfig
from sr.events import RecordingSink
from sr.pool import open_router
from sr.pool.views import ReplicaView, inventory_from_json
from sr.router.inventory_table import render_inventory
from sr.router.serve import serve

pytestmark = pytest.mark.e2e

HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
FOURTH = "127.0.0.5"
NAME = "sr-workers.fleet.test"
KEY = "fleet-test-key"
CLIENTS = 4
TEST_LIMIT_S = 60


def port_free_on(hosts: list[str]) -> int:
    """One port number free on every host (the fleet listens on one port, like a
    Kubernetes headless service)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((hosts[0], 0))
            port = probe.getsockname()[1]
        try:
            for host in hosts:
                with socket.socket() as other:
                    other.bind((host, port))
        except OSError:
            continue
        return port
    raise AssertionError("no port free on every loopback address")


class Fleet:
    """The worker processes, one per host address, all on `port`, all keyed."""

    def __init__(self, model_dir, port: int) -> None:
        self.model_dir = model_dir
        self.port = port
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, host: str) -> None:
        argv = ["--artifact", str(self.model_dir), "--host", host, "--port", str(self.port)]
        self.procs[host] = subprocess.Popen(
            [sys.executable, "-m", "sr", "worker", *argv, "--threads", "1"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "SR_WORKER_API_KEY": KEY, "OMP_NUM_THREADS": "1"},
        )

    def kill(self, host: str) -> None:
        proc = self.procs[host]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


class Resolver:
    """What the fleet's name resolves to right now (`hosts`)."""

    def __init__(self, hosts: list[str], port: int) -> None:
        self.hosts = list(hosts)
        self.port = port

    async def resolve(self, host: str, port: int):
        assert (host, port) == (NAME, self.port)
        return [(h, self.port) for h in self.hosts]


class Load:
    """CLIENTS concurrent clients posting embeddings until stopped; every answer that is
    not a 200 (or no answer at all) is an error."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ok = 0
        self.errors: list[str] = []
        self.phase = "start"  # named in each error
        self.stop = trio.Event()
        self.stopped = trio.Event()

    async def run(self) -> None:
        async with (
            httpx.AsyncClient(base_url=self.url, timeout=20) as client,
            trio.open_nursery() as nursery,
        ):
            for index in range(CLIENTS):
                nursery.start_soon(self._client, client, index)
        self.stopped.set()

    async def _client(self, client: httpx.AsyncClient, index: int) -> None:
        sent = 0
        while not self.stop.is_set():
            sent += 1
            body = {"model": "primary", "input": [f"client {index} request {sent}"]}
            try:
                answer = await client.post("/v1/embeddings", json=body)
            except httpx.HTTPError as error:
                self.errors.append(f"{self.phase}: {type(error).__name__}: {error}")
                continue
            if answer.status_code == 200:
                self.ok += 1
            else:
                self.errors.append(f"{self.phase}: {answer.status_code}: {answer.text[:200]}")

    async def at_least(self, more: int) -> None:
        target = self.ok + more
        while self.ok < target:
            await trio.sleep(0.02)


def replicas_by_host(core) -> dict[str, ReplicaView]:
    rows = core.inventory().deployments["primary"].replicas
    return {row.endpoint.split("//")[1].rsplit(":", 1)[0]: row for row in rows}


def discovered(core) -> dict[str, str]:
    (entry,) = core.inventory().deployments["primary"].discovery
    return {row.address.rsplit(":", 1)[0]: row.status for row in entry.discovered}


async def until(condition, what: str, timeout_s: float = 30) -> None:
    with trio.move_on_after(timeout_s):
        while not condition():
            await trio.sleep(0.05)
        return
    raise AssertionError(f"timed out waiting for {what}")


async def test_discovered_fleet_survives_a_kill_readmits_grows_and_drains(
    tiny_model_dir, tmp_path, monkeypatch
):
    began = time.monotonic()
    monkeypatch.setenv("SR_TEST_FLEET_KEY", KEY)
    port = port_free_on([*HOSTS, FOURTH])
    fleet = Fleet(tiny_model_dir, port)
    for host in [*HOSTS, FOURTH]:  # all loading at once; the fourth joins later
        fleet.start(host)
    resolver = Resolver(HOSTS, port)
    entry = Replica(
        discover=f"dns://{NAME}:{port}",
        model=str(tiny_model_dir),
        api_key_env="SR_TEST_FLEET_KEY",
        refresh_s=1,
    )
    cfg = SrConfig(listeners=[Listener(host="127.0.0.1", port=0)])
    cfg.deployments["primary"] = Deployment(artifact=str(tiny_model_dir), replicas=[entry])
    sink = RecordingSink()
    router = functools.partial(open_router, resolver=resolver, run_dir=tmp_path / "run")
    try:
        with trio.fail_after(TEST_LIMIT_S):
            async with trio.open_nursery() as nursery:
                serving = await nursery.start(
                    functools.partial(
                        serve, cfg, events=sink, open_router=router, out=io.StringIO()
                    )
                )
                core = serving.core
                await until(lambda: set(discovered(core).values()) == {"member"}, "3 members")
                assert sorted(discovered(core)) == HOSTS
                load = Load(serving.url)
                nursery.start_soon(load.run)
                await load.at_least(20)

                # SIGKILL one host's worker under load
                victim = HOSTS[1]
                victim_id = replicas_by_host(core)[victim].id
                load.phase = "kill"
                fleet.kill(victim)
                await until(lambda: not replicas_by_host(core)[victim].ready, "kill seen")
                await load.at_least(30)
                assert load.errors == []

                # it comes back on the same address: the same replica, readmitted
                load.phase = "readmit"
                fleet.start(victim)
                await until(lambda: replicas_by_host(core)[victim].ready, "readmitted")
                assert replicas_by_host(core)[victim].id == victim_id
                await load.at_least(20)

                # a fourth address joins without a restart
                load.phase = "join"
                resolver.hosts.append(FOURTH)
                await until(lambda: discovered(core).get(FOURTH) == "member", "4th joined")
                assert replicas_by_host(core)[FOURTH].ready
                await load.at_least(20)

                # an address removed is drained, then forgotten
                leaving = HOSTS[2]
                load.phase = "drain"
                resolver.hosts.remove(leaving)
                await until(lambda: leaving not in discovered(core), "drained")
                assert leaving not in replicas_by_host(core)
                await load.at_least(20)

                # what an operator sees: the HTTP inventory and `sr inventory`'s table
                async with httpx.AsyncClient(base_url=serving.url) as client:
                    answer = await client.get("/api/v1/inventory/model-runtime")
                (entry,) = answer.json()["deployments"]["primary"]["discovery"]
                assert entry["last_good_resolution"]["count"] == 3
                assert entry["last_resolution"]["error"] is None
                lines = render_inventory(inventory_from_json(answer.json()))
                assert f"  discover dns://{NAME}:{port}: 3/3 joined; resolved" in "\n".join(lines)

                load.phase = "stop"
                load.stop.set()
                await load.stopped.wait()  # no request races the router's own shutdown
                serving.shutdown()
        assert load.errors == []
        assert [e["address"] for e in sink.named("discovered_replica_leaving")] == [
            f"{leaving}:{port}"
        ]
        joined = [e["address"].rsplit(":", 1)[0] for e in sink.named("discovered_replica_joined")]
        assert sorted(joined) == sorted([*HOSTS, FOURTH])  # the victim rejoined as itself
        print(f"multi-host: {load.ok} answers, 0 errors, {time.monotonic() - began:.1f}s")
    finally:
        fleet.stop_all()
