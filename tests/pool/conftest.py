"""Pool test fixtures: policies and records without processes or sockets."""

from __future__ import annotations

import itertools
import json
import types
import typing

import pytest
import trio

from sr.config.schema import Deployment, OutlierDetection, Replica, SrConfig
from sr.events import RecordingSink
from sr.http.hop import NO_HOP
from sr.pool.policy import DeploymentPolicy
from sr.pool.record import ReplicaRecord
from sr.pool.state import ReplicaState
from sr.pool.transport import TransportError


def make_policy(
    n: int, *, ready: bool = True, outlier: OutlierDetection | None = None, now: float = 0.0
) -> tuple[DeploymentPolicy, list[ReplicaRecord], RecordingSink]:
    sink = RecordingSink()
    seq = itertools.count(1)
    policy = DeploymentPolicy(
        "d", next_sequence=lambda: next(seq), outlier=outlier or OutlierDetection(), events=sink
    )
    records = [ReplicaRecord(replica_id=f"r{i}", deployment="d", placement="cpu") for i in range(n)]
    policy.publish(records, policy.outlier)
    if ready:
        for rec in records:
            policy.set_lifecycle(rec, ReplicaState.READY, now)
    return policy, records, sink


@pytest.fixture(name="make_policy")
def _make_policy_fixture():
    return make_policy


class FakeWorker:
    """An in-process stand-in for WorkerService: same `run` / `handle` shape.

    `behaviour` (shared by every FakeWorker of a test) says how to answer: "ok", "hang",
    "fail" (500), "bad" (400), "die" (no HTTP answer, as when the process dies
    mid-request), "die_once" (only the first worker to get a request dies); `load_s` how
    long loading takes; `limits` the card's caps; `adaptive` the card's adaptive_threads;
    `health_failed` a reason to report `failed` on /health; `artifact` what the card says
    it serves (default: the artifact it was started with).
    """

    behaviour: typing.ClassVar[dict] = {}
    instances: typing.ClassVar[list] = []

    def __init__(self, options) -> None:
        self.instances.append(self)
        self.options = options
        self.state = "loading"
        self.served = 0
        self.died = 0
        self.traceparents: list[str] = []  # what the router's hop sent (traces on)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep(self.behaviour.get("load_s", 0.5))
        reason = self.behaviour.get("health_failed")
        self.state = "failed" if reason else "ready"
        await trio.sleep_forever()

    async def handle(self, method: str, path: str, body: bytes, hop=NO_HOP):
        if hop.traceparent is not None:
            self.traceparents.append(hop.traceparent)
        headers = [(b"content-type", b"application/json")]
        if path == "/health":
            if self.state == "ready":
                return 200, headers, b'{"status":"ready"}'
            reason = self.behaviour.get("health_failed") or "loading"
            return 503, headers, json.dumps({"status": self.state, "reason": reason}).encode()
        if path == "/v1/models":
            limits = self.behaviour.get("limits", {"max_num_seqs": 64})
            artifact = self.behaviour.get("artifact", self.options.artifact)
            card = {"id": artifact, "threads": self.options.threads, "limits": limits}
            if "adaptive" in self.behaviour:
                card["adaptive_threads"] = self.behaviour["adaptive"]
            return 200, headers, json.dumps({"object": "list", "data": [card]}).encode()
        mode = self.behaviour.get("mode", "ok")
        if mode == "hang" or (mode == "hang_first" and self is self.instances[0]):
            await trio.sleep_forever()
        if mode == "die" or (mode == "die_once" and not any(w.died for w in self.instances)):
            self.died += 1
            raise TransportError("connection reset by peer")
        if mode == "fail":
            return 500, headers, b'{"error":{"code":"internal","message":"boom"}}'
        if mode == "bad":
            return 400, headers, b'{"error":{"code":"invalid_request","message":"input: bad"}}'
        self.served += 1
        answer = {"model": json.loads(body).get("model"), "echo": json.loads(body)}
        return 200, headers, json.dumps(answer).encode()


@pytest.fixture
def fake_worker():
    FakeWorker.behaviour = {}
    FakeWorker.instances = []
    yield FakeWorker
    FakeWorker.behaviour = {}


class FakeEndpoint:
    """An attached worker the operator runs: the test sets what /health and the card say.

    `health` is "ready", a progress status, "failed" or "down" (no connection at all);
    `artifact` is what the card reports; `probes` counts /health requests."""

    def __init__(self, artifact: str = "/models/tiny") -> None:
        self.health = "ready"
        self.reason = "operator stopped it"
        self.artifact = artifact
        self.probes = 0
        self.served = 0

    async def handle(self, method, path, body, hop=NO_HOP):
        headers = [(b"content-type", b"application/json")]
        if self.health == "down":
            raise TransportError("connection refused")
        if path == "/health":
            self.probes += 1
            if self.health == "ready":
                return 200, headers, b'{"status":"ready"}'
            answer = {"status": self.health, "reason": self.reason}
            return 503, headers, json.dumps(answer).encode()
        if path == "/v1/models":
            card = {"id": self.artifact, "artifact": self.artifact, "threads": 3, "limits": {}}
            return 200, headers, json.dumps({"object": "list", "data": [card]}).encode()
        self.served += 1
        return 200, headers, b"{}"


@pytest.fixture
def fake_endpoint():
    return FakeEndpoint()


def config_with(*deployments) -> SrConfig:
    """An SrConfig holding (name, Deployment) pairs."""
    cfg = SrConfig()
    for name, deployment in deployments:
        cfg.deployments[name] = deployment
    return cfg


def cpu_deployment(n: int, **fields) -> Deployment:
    return Deployment(artifact="/models/tiny", replicas=[Replica(device="cpu")] * n, **fields)


@pytest.fixture
def configs():
    """Config builders: `configs.config_with(("d", deployment))`, `configs.cpu(n, **fields)`."""
    return types.SimpleNamespace(config_with=config_with, cpu=cpu_deployment)
