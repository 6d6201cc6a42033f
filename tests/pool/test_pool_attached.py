"""Attached replicas (an operator's worker at an endpoint) under a mock clock: never
terminal, re-probed slowly while failed, and checked against the deployment's artifact."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from sr.config.schema import Deployment, Replica
from sr.errors import Unavailable
from sr.pool.deployment import DeploymentPool
from sr.pool.record import ReplicaRecord
from sr.pool.replica import PROBE_READY_S, ReplicaRunner, incompatibility
from sr.pool.state import IllegalTransition, ReplicaState, check_transition, is_terminal
from sr.pool.transport import InProcessTransport

S = ReplicaState
ENDPOINT = "http://10.0.0.5:8100"


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


def attached_runner(make_policy, endpoint_fake, tmp_path, artifact="/models/tiny"):
    policy, _, sink = make_policy(0)
    placement = Replica(endpoint=ENDPOINT, model="tiny")
    deployment = Deployment(artifact=artifact, replicas=[placement])
    record = ReplicaRecord(replica_id="a0", deployment="d", placement=ENDPOINT, attached=True)
    policy.publish([record], policy.outlier)
    runner = ReplicaRunner(
        record=record,
        placement=placement,
        deployment=deployment,
        policy=policy,
        threads=2,
        run_dir=tmp_path,
        connect_endpoint=lambda url: InProcessTransport(endpoint_fake),
    )
    return runner, policy, sink


async def test_failed_attached_replica_is_reprobed_slowly_and_comes_back(
    make_policy, fake_endpoint, tmp_path, autojump_clock
):
    fake_endpoint.health = "failed"
    runner, policy, sink = attached_runner(make_policy, fake_endpoint, tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        await trio.sleep(1)
        rec = runner.record
        assert (rec.lifecycle, rec.reason) == (S.FAILED, "operator stopped it")
        assert not runner.done.is_set()  # still probing, not parked forever
        before = fake_endpoint.probes
        await trio.sleep(10 * PROBE_READY_S)
        assert fake_endpoint.probes - before == pytest.approx(10, abs=1)  # slow cadence
        with pytest.raises(Unavailable):
            policy.reserve(1, now=trio.current_time())

        fake_endpoint.health = "down"  # the operator restarts it
        await trio.sleep(2 * PROBE_READY_S)
        assert rec.lifecycle is S.UNREACHABLE
        fake_endpoint.health = "loading"
        await trio.sleep(2 * PROBE_READY_S)
        assert rec.lifecycle is S.LOADING
        fake_endpoint.health = "ready"
        await trio.sleep(1)
        assert (rec.lifecycle, rec.reason, rec.threads) == (S.READY, None, 3)
        assert policy.reserve(1, now=trio.current_time()).record is rec
        states = [e["state"] for e in sink.named("replica_state")]
        assert states[-4:] == ["failed", "unreachable", "loading", "ready"]
        nursery.cancel_scope.cancel()


async def test_attached_worker_serving_another_model_is_incompatible_until_replaced(
    make_policy, fake_endpoint, tmp_path, autojump_clock
):
    fake_endpoint.artifact = "/models/other"
    runner, policy, _ = attached_runner(make_policy, fake_endpoint, tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        await trio.sleep(1)
        rec = runner.record
        assert rec.lifecycle is S.INCOMPATIBLE
        assert "'/models/tiny'" in rec.reason and "'/models/other'" in rec.reason
        with pytest.raises(Unavailable):
            policy.reserve(1, now=trio.current_time())
        assert fake_endpoint.served == 0
        fake_endpoint.artifact = "/models/tiny"  # the operator starts the right model
        await trio.sleep(2 * PROBE_READY_S)
        assert (rec.lifecycle, rec.reason) == (S.READY, None)
        nursery.cancel_scope.cancel()


async def test_ready_attached_worker_swapped_for_another_model_is_caught(
    make_policy, fake_endpoint, tmp_path, autojump_clock
):
    runner, _, _ = attached_runner(make_policy, fake_endpoint, tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        await trio.sleep(1)
        assert runner.record.lifecycle is S.READY
        fake_endpoint.health = "down"
        await trio.sleep(2 * PROBE_READY_S)
        fake_endpoint.health, fake_endpoint.artifact = "ready", "/models/other"
        await trio.sleep(2 * PROBE_READY_S)
        assert runner.record.lifecycle is S.INCOMPATIBLE
        nursery.cancel_scope.cancel()


def test_card_artifact_mismatch_is_an_incompatibility():
    deployment = Deployment(artifact="/models/tiny", device="cpu")
    assert incompatibility(deployment, {"id": "/models/tiny", "limits": {}}) is None
    assert incompatibility(deployment, {"artifact": "/models/tiny/"}) is None
    assert incompatibility(deployment, {"limits": {}}) is None  # says nothing: not held
    why = incompatibility(deployment, {"id": "x", "artifact": "/models/big"})
    assert why == "artifact: deployment serves '/models/tiny', worker serves '/models/big'"
    assert "worker serves 'x'" in incompatibility(deployment, {"id": "x"})


def test_card_revision_other_than_the_pinned_one_is_an_incompatibility():
    pinned = Deployment(artifact="/models/tiny", device="cpu", revision="v2")
    assert incompatibility(pinned, {"artifact": "/models/tiny", "revision": "v2"}) is None
    assert incompatibility(pinned, {"artifact": "/models/tiny"}) is None  # says nothing
    why = incompatibility(pinned, {"artifact": "/models/tiny", "revision": "v1"})
    assert why == "revision: deployment pins 'v2', worker serves 'v1'"
    assert "worker serves None" in incompatibility(pinned, {"revision": None})  # unpinned
    unpinned = Deployment(artifact="/models/tiny", device="cpu")
    assert incompatibility(unpinned, {"artifact": "/models/tiny", "revision": "v1"}) is None


def test_card_dtype_other_than_the_deployments_is_an_incompatibility():
    bf16 = Deployment(artifact="/models/tiny", device="cpu", dtype="bfloat16")
    assert incompatibility(bf16, {"artifact": "/models/tiny", "dtype": "bfloat16"}) is None
    assert incompatibility(bf16, {"artifact": "/models/tiny"}) is None  # says nothing
    why = incompatibility(bf16, {"artifact": "/models/tiny", "dtype": "float32"})
    assert why == "dtype: deployment serves bfloat16, worker serves float32"


def test_attached_replicas_are_never_terminal_managed_ones_are():
    for state in (S.FAILED, S.INCOMPATIBLE):
        assert is_terminal(state, attached=False)
        assert not is_terminal(state, attached=True)
        assert check_transition(state, S.READY, attached=True) is True
        with pytest.raises(IllegalTransition):
            check_transition(state, S.READY)
    with pytest.raises(IllegalTransition):
        check_transition(S.DRAINING, S.READY, attached=True)


def test_all_terminal_ignores_failed_attached_replicas(make_policy, tmp_path):
    policy, _, _ = make_policy(0)
    deployment = Deployment(
        artifact="/models/tiny", replicas=[Replica(device="cpu"), Replica(endpoint=ENDPOINT)]
    )
    pool = DeploymentPool("d", deployment, policy)
    runners = {}
    for i, placement in enumerate(deployment.placements()):
        record = ReplicaRecord(
            replica_id=f"r{i}", deployment="d", placement="x", attached=placement.attached
        )
        policy.set_lifecycle(record, S.FAILED, 0.0, "boom")
        runners[record.id] = ReplicaRunner(
            record=record,
            placement=placement,
            deployment=deployment,
            policy=policy,
            threads=1,
            run_dir=tmp_path,
        )
    pool.runners = runners
    assert not pool.all_terminal()  # the attached one may come back
    pool.runners = {"r0": runners["r0"]}
    assert pool.all_terminal()


def test_an_auto_deployment_accepts_the_dtype_the_workers_host_chose():
    card = {"artifact": "a", "dtype": "bfloat16", "precision": {"requested": "auto"}}
    assert incompatibility(Deployment(artifact="a"), card) is None  # dtype: auto
    assert incompatibility(Deployment(artifact="a", dtype="bfloat16"), card) is None
    why = incompatibility(Deployment(artifact="a", dtype="float32"), card)
    assert why == "dtype: deployment serves float32, worker serves bfloat16"
