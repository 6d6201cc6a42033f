"""Pool test fixtures: policies and records without processes or sockets."""

from __future__ import annotations

import itertools

import pytest

from sr.config.schema import OutlierDetection
from sr.events import RecordingSink
from sr.pool.policy import DeploymentPolicy
from sr.pool.record import ReplicaRecord
from sr.pool.state import ReplicaState


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
