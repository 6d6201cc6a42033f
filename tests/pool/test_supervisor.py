"""Supervisor with in-process fake workers under a mock clock: the I/O layer's rules."""

from __future__ import annotations

import functools

import pytest
import trio
import trio.testing

from sr.config.load import dump_config
from sr.config.schema import DEFAULT_TIMEOUT_MS, Deployment, OutlierDetection, Replica
from sr.errors import (
    DeadlineExceeded,
    InvalidRequest,
    ModelNotFound,
    Overloaded,
    ReloadInProgress,
    WorkerFailed,
)
from sr.events import RecordingSink
from sr.pool import ReloadFailed, StartupFailed, open_router
from sr.pool.identity import replica_identities
from sr.pool.outcome import Outcome
from sr.pool.views import startup_status_json
from sr.router.reload import ConfigReloader


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


def router(config, fake_worker, tmp_path, sink=None):
    return open_router(
        config,
        events=sink or RecordingSink(),
        in_process=True,
        threads=2,
        run_dir=tmp_path / "run",
        worker_factory=fake_worker,
    )


async def test_requests_flow_and_inventory(fake_worker, configs, tmp_path, autojump_clock):
    sink = RecordingSink()
    cfg = configs.config_with(("primary", configs.cpu(2)))
    async with router(cfg, fake_worker, tmp_path, sink) as core:
        assert not core.is_ready()
        assert core.inventory().deployments["primary"].state == "starting"
        await core.wait_ready(5)
        await trio.sleep(1)  # wait_ready needs one ready replica; let the second load too
        assert core.resolve("/models/tiny") == "primary"
        with pytest.raises(ModelNotFound):
            core.resolve("nope")
        answer = await core.request("primary", "/v1/embeddings", {"input": "hi"})
        assert answer["model"] == "/models/tiny"
        inv = core.inventory().deployments["primary"]
        assert (inv.desired_replicas, inv.ready_replicas, inv.state) == (2, 2, "ready")
        row = inv.replicas[0]
        assert row.threads == 2 and row.device == "cpu" and row.inflight == 0
        states = [(e["state"]) for e in sink.named("replica_state")]
        assert states.count("ready") == 2 and "loading" in states
        status = startup_status_json(core.inventory())
        assert status["ready"] is True
        assert set(status["deployments"]["primary"]["replicas"][0]) >= {"id", "state", "reason"}


async def test_deadline_is_timeout_and_releases_admission(
    fake_worker, configs, tmp_path, autojump_clock
):
    fake_worker.behaviour["mode"] = "hang"
    cfg = configs.config_with(("d", configs.cpu(1, timeout_ms=2000)))
    async with router(cfg, fake_worker, tmp_path) as core:
        await core.wait_ready(5)
        start = trio.current_time()
        with pytest.raises(DeadlineExceeded):
            await core.request_raw("d", "/v1/embeddings", b"{}", timeout_s=0.5)
        assert trio.current_time() - start == pytest.approx(0.5)
        await trio.sleep(0.1)  # the timeout put the replica in backoff for 0.1 s
        with pytest.raises(DeadlineExceeded):
            await core.request_raw("d", "/v1/embeddings", b"{}", timeout_s=60)
        assert trio.current_time() - start == pytest.approx(0.5 + 0.1 + 2.0, abs=0.25)
        row = core.inventory().deployments["d"].replicas[0]
        assert (row.inflight, row.outstanding_bytes, row.consecutive_timeouts) == (
            0,
            0,
            2,
        )


async def test_without_timeout_ms_a_hung_forward_times_out_at_the_default(
    fake_worker, configs, tmp_path, autojump_clock
):
    fake_worker.behaviour["mode"] = "hang"
    cfg = configs.config_with(("d", configs.cpu(1)))  # no timeout_ms
    async with router(cfg, fake_worker, tmp_path) as core:
        await core.wait_ready(5)
        start = trio.current_time()
        with pytest.raises(DeadlineExceeded):
            await core.request_raw("d", "/v1/embeddings", b"{}", timeout_s=None)
        assert trio.current_time() - start == pytest.approx(DEFAULT_TIMEOUT_MS / 1000)
        row = core.inventory().deployments["d"].replicas[0]
        assert (row.inflight, row.consecutive_timeouts) == (0, 1)  # counted against it


async def test_outer_cancel_is_canceled_and_releases(
    fake_worker, configs, tmp_path, autojump_clock
):
    fake_worker.behaviour["mode"] = "hang"
    cfg = configs.config_with(("d", configs.cpu(1)))
    async with router(cfg, fake_worker, tmp_path) as core:
        await core.wait_ready(5)
        with trio.move_on_after(1):
            await core.request_raw("d", "/v1/embeddings", b"{}")
        row = core.inventory().deployments["d"].replicas[0]
        assert (row.inflight, row.consecutive_timeouts, row.state.value) == (0, 0, "ready")


async def test_admission_cap_through_the_core(fake_worker, configs, tmp_path, autojump_clock):
    fake_worker.behaviour["mode"] = "hang"
    cfg = configs.config_with(("d", configs.cpu(2)))
    async with router(cfg, fake_worker, tmp_path) as core:
        await core.wait_ready(5)
        await trio.sleep(1)  # both replicas loaded
        async with trio.open_nursery() as nursery:
            for _ in range(64):
                nursery.start_soon(core.request_raw, "d", "/v1/embeddings", b"{}")
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(Overloaded):
                await core.request_raw("d", "/v1/embeddings", b"{}")
            rows = core.inventory().deployments["d"].replicas
            assert [r.inflight for r in rows] == [32, 32]
            nursery.cancel_scope.cancel()
        rows = core.inventory().deployments["d"].replicas
        assert [r.inflight for r in rows] == [0, 0]


async def test_worker_4xx_and_5xx(fake_worker, configs, tmp_path, autojump_clock):
    cfg = configs.config_with(("d", configs.cpu(1)))
    async with router(cfg, fake_worker, tmp_path) as core:
        await core.wait_ready(5)
        fake_worker.behaviour["mode"] = "bad"
        reply = await core.request_raw("d", "/v1/embeddings", b"{}")
        assert reply.status == 400 and reply.replica_id.startswith("d-")
        with pytest.raises(InvalidRequest, match="input: bad"):
            await core.request("d", "/v1/embeddings", {"input": 1})
        fake_worker.behaviour["mode"] = "fail"
        with pytest.raises(WorkerFailed, match="boom"):
            await core.request_raw("d", "/v1/embeddings", b"{}")
        assert core.inventory().deployments["d"].replicas[0].state.value == "backoff"


async def test_incompatible_replica_is_shown_and_never_dispatched(
    fake_worker, configs, tmp_path, autojump_clock
):
    fake_worker.behaviour["limits"] = {"max_num_seqs": 32}
    cfg = configs.config_with(("d", configs.cpu(1, max_num_seqs=64)))
    async with router(cfg, fake_worker, tmp_path) as core:
        with pytest.raises(StartupFailed, match="max_num_seqs: deployment sets 64"):
            await core.wait_ready(5)
        row = core.inventory().deployments["d"].replicas[0]
        assert row.state.value == "incompatible" and "worker reports 32" in row.reason


async def test_worker_serving_another_artifact_is_incompatible(
    fake_worker, configs, tmp_path, autojump_clock
):
    fake_worker.behaviour["artifact"] = "/models/other"
    cfg = configs.config_with(("d", configs.cpu(1)))
    async with router(cfg, fake_worker, tmp_path) as core:
        with pytest.raises(StartupFailed, match="artifact: deployment serves '/models/tiny'"):
            await core.wait_ready(5)
        row = core.inventory().deployments["d"].replicas[0]
        assert row.state.value == "incompatible" and "'/models/other'" in row.reason


async def test_startup_fails_fast_when_every_replica_fails(
    fake_worker, configs, tmp_path, autojump_clock
):
    fake_worker.behaviour["health_failed"] = "artifact not found: /models/tiny"
    cfg = configs.config_with(("d", configs.cpu(2)))
    async with router(cfg, fake_worker, tmp_path) as core:
        start = trio.current_time()
        with pytest.raises(StartupFailed) as info:
            await core.wait_ready(600)
        assert trio.current_time() - start < 2
        assert "'d'" in str(info.value) and "artifact not found" in str(info.value)
        assert "d-" in str(info.value)  # names the replica


async def test_ejection_end_to_end_through_the_core(fake_worker, configs, tmp_path, autojump_clock):
    sink = RecordingSink()
    od = OutlierDetection(consecutive_timeouts=1, base_ejection_ms=10_000)
    cfg = configs.config_with(("d", configs.cpu(2, timeout_ms=1000, outlier_detection=od)))
    async with router(cfg, fake_worker, tmp_path, sink) as core:
        await core.wait_ready(5)
        fake_worker.behaviour["mode"] = "hang_first"
        outcomes = []
        for _ in range(6):
            try:
                await core.request_raw("d", "/v1/embeddings", b"{}")
                outcomes.append("ok")
            except DeadlineExceeded:
                outcomes.append("timeout")
            await trio.sleep(0.2)  # past the request backoff
        # first timeout withheld (no other ok yet); the second ejects
        assert outcomes.count("timeout") == 2 and outcomes[-2:] == ["ok", "ok"]
        withheld = sink.named("replica_ejection_withheld")
        assert [w["rule"] for w in withheld] == ["serving_replica"]
        ejected = sink.named("replica_ejected")
        assert len(ejected) == 1 and ejected[0]["duration_ms"] == 10_000
        row = next(r for r in core.inventory().deployments["d"].replicas if r.ejections)
        assert row.state.value == "ejected" and 0 < row.ejected_for_ms <= 10_000
        await trio.sleep(10.5)
        readmitted = sink.named("replica_readmitted")
        assert readmitted and readmitted[0]["reason"] == "cooldown"


async def test_reload_keeps_unchanged_replicas_and_bindings_restart_nothing(
    fake_worker, configs, tmp_path, autojump_clock
):
    cfg = configs.config_with(("d", configs.cpu(2)))
    async with router(cfg, fake_worker, tmp_path) as core:
        await core.wait_ready(5)
        before = dict(core.pools["d"].runners)
        bigger = configs.config_with(("d", configs.cpu(3)))
        bigger.global_.model_catalog.bindings = {"chat": "d"}
        await core.reload(bigger, timeout_s=5)
        after = core.pools["d"].runners
        assert len(after) == 3 and all(after[k] is v for k, v in before.items())
        assert core.inventory().deployments["d"].ready_replicas == 3
        smaller = configs.config_with(("d", configs.cpu(1)))
        await core.reload(smaller, timeout_s=5)
        await trio.sleep(1)
        assert list(core.pools["d"].runners) == list(before)[:1]
        assert sum(r.done.is_set() for r in before.values()) == 1  # the retired one stopped


async def test_failed_reload_leaves_old_config_serving(
    fake_worker, configs, tmp_path, autojump_clock
):
    cfg = configs.config_with(("d", configs.cpu(1)))
    async with router(cfg, fake_worker, tmp_path) as core:
        await core.wait_ready(5)
        fake_worker.behaviour["health_failed"] = "golden check failed"
        new = configs.config_with(("d", configs.cpu(1)), ("e", configs.cpu(1)))
        with pytest.raises(ReloadFailed, match="golden check failed"):
            await core.reload(new, timeout_s=5)
        assert list(core.pools) == ["d"] and core.config is cfg
        assert (await core.request("d", "/v1/embeddings", {"input": "x"}))["model"]


def test_identity_shorthand_equals_one_explicit_replica():
    short = Deployment(artifact="a", device="cpu")
    explicit = Deployment(artifact="a", replicas=[Replica(device="cpu")])
    assert replica_identities("p", short, 2) == replica_identities("p", explicit, 2)
    two = [
        i
        for i, _ in replica_identities(
            "p", Deployment(artifact="a", replicas=[Replica("cpu")] * 2), 2
        )
    ]
    assert len(set(two)) == 2 and two[0] == replica_identities("p", short, 2)[0][0]
    changed = Deployment(artifact="a", device="cpu", max_num_seqs=8)
    assert replica_identities("p", changed, 2)[0][0] != two[0]


def test_a_dtype_change_is_a_new_identity_and_auto_keeps_the_old_one():
    # A reload that changes only the dtype restarts the workers; auto (the default)
    # leaves the identities every replica had before dtype existed.
    base = replica_identities("p", Deployment(artifact="a", device="cpu"), 2)
    same = replica_identities("p", Deployment(artifact="a", device="cpu", dtype="auto"), 2)
    f32 = replica_identities("p", Deployment(artifact="a", device="cpu", dtype="float32"), 2)
    bf16 = replica_identities("p", Deployment(artifact="a", device="cpu", dtype="bfloat16"), 2)
    assert same == base and bf16[0][0] != base[0][0] and f32[0][0] != base[0][0]


async def test_request_whose_worker_died_is_retried_once_on_another(
    fake_worker, configs, tmp_path, autojump_clock
):
    cfg = configs.config_with(("d", configs.cpu(2)))
    async with router(cfg, fake_worker, tmp_path) as core:
        await core.wait_ready(5)
        await trio.sleep(1)  # every replica ready, not just one
        fake_worker.behaviour["mode"] = "die_once"
        replies = [await core.request_raw("d", "/v1/embeddings", b"{}") for _ in range(3)]
        assert all(reply.status == 200 for reply in replies)
        dead, alive = sorted(fake_worker.instances, key=lambda w: -w.died)
        assert (dead.died, dead.served, alive.served) == (1, 0, 3)  # backed off after dying
        rows = core.inventory().deployments["d"].replicas
        assert sorted(row.state.value for row in rows) == ["backoff", "ready"]


async def test_retry_is_once_and_a_lone_dead_worker_is_worker_failed(
    fake_worker, configs, tmp_path, autojump_clock
):
    cfg = configs.config_with(("one", configs.cpu(1)), ("two", configs.cpu(2)))
    async with router(cfg, fake_worker, tmp_path) as core:
        await core.wait_ready(5)
        await trio.sleep(1)  # every replica ready, not just one
        fake_worker.behaviour["mode"] = "die"
        with pytest.raises(WorkerFailed, match="connection reset"):
            await core.request_raw("one", "/v1/embeddings", b"{}")
        with pytest.raises(WorkerFailed, match="connection reset"):
            await core.request_raw("two", "/v1/embeddings", b"{}")
        deaths = sorted(w.died for w in fake_worker.instances)
        assert deaths == [1, 1, 1]  # "one" tried once, "two" once per replica, no more


async def test_inventory_follows_adaptive_thread_learning_until_it_settles(
    fake_worker, configs, tmp_path, autojump_clock
):
    cfg = configs.config_with(("d", configs.cpu(1)))
    fake_worker.behaviour["adaptive"] = {"mode": 1, "status": "learning", "table": {}}
    async with router(cfg, fake_worker, tmp_path) as core:
        await core.wait_ready(5)
        row = core.inventory().deployments["d"].replicas[0]
        assert row.adaptive_threads["status"] == "learning"
        learned = {"mode": 1, "status": "learned", "table": {"4": {"learned": 1}}}
        fake_worker.behaviour["adaptive"] = learned
        await trio.sleep(5)  # a few slow probes
        row = core.inventory().deployments["d"].replicas[0]
        assert row.adaptive_threads == learned
        fake_worker.behaviour["adaptive"] = {"mode": 1, "status": "changed-after-settling"}
        await trio.sleep(5)
        row = core.inventory().deployments["d"].replicas[0]
        assert row.adaptive_threads == learned  # settled: no more card reads


async def test_wait_ready_resumes_when_the_replica_turns_ready_not_on_a_tick(
    fake_worker, configs, tmp_path, autojump_clock
):
    fake_worker.behaviour["load_s"] = 0.777
    async with router(configs.config_with(("d", configs.cpu(1))), fake_worker, tmp_path) as core:
        await trio.sleep(0.0123)  # off the prober's 0.1 s grid
        await core.wait_ready(5)
        (runner,) = core.pools["d"].runners.values()
        # the instant the prober set READY (sr.pool.policy.set_lifecycle)
        assert trio.current_time() == runner.record.restart.healthy_since


async def test_wait_ready_fails_at_the_instant_the_last_replica_fails(
    fake_worker, configs, tmp_path, autojump_clock
):
    fake_worker.behaviour["health_failed"] = "golden check failed"
    async with router(configs.config_with(("d", configs.cpu(1))), fake_worker, tmp_path) as core:
        failed_at: list[float] = []
        core.events.subscribe(
            lambda event, fields: (
                failed_at.append(trio.current_time()) if fields.get("state") == "failed" else None
            )
        )
        await trio.sleep(0.0123)
        with pytest.raises(StartupFailed, match="golden check failed"):
            await core.wait_ready(5)
        assert failed_at == [trio.current_time()]


async def test_reload_publishes_when_its_new_replicas_turn_ready(
    fake_worker, configs, tmp_path, autojump_clock
):
    async with router(configs.config_with(("d", configs.cpu(1))), fake_worker, tmp_path) as core:
        await core.wait_ready(5)
        fake_worker.behaviour["load_s"] = 1.2345
        new_runners = []
        new_runner = core._new_runner

        def recording_new_runner(*args, **kwargs):
            new_runners.append(new_runner(*args, **kwargs))
            return new_runners[-1]

        core._new_runner = recording_new_runner
        probed_at: list[float] = []

        async def probe_off_the_grid() -> None:
            # Loaded at +1.2345; a probe asked for at +1.2777 sees it ready then, off the
            # probers' 0.1 s grid (the grid a 0.05 s poll of the reload would also hit).
            await trio.sleep(1.2777)
            probed_at.append(trio.current_time())
            for runner in new_runners:
                runner.request_probe()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe_off_the_grid)
            await core.reload(configs.config_with(("d", configs.cpu(3))), timeout_s=5)
            assert len(new_runners) == 2 and trio.current_time() == probed_at[0]
            assert all(r.record.restart.healthy_since == probed_at[0] for r in new_runners)


async def test_retire_stops_the_replica_when_its_last_request_ends(
    fake_worker, configs, tmp_path, autojump_clock
):
    async with router(configs.config_with(("d", configs.cpu(1))), fake_worker, tmp_path) as core:
        await core.wait_ready(5)
        pool = core.pools["d"]
        (runner,) = pool.runners.values()
        held = pool.policy.reserve(100, trio.current_time())
        retired_at: list[float] = []

        async def retire() -> None:
            await runner.retire(drain_timeout_s=30)
            retired_at.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(retire)
            await trio.sleep(0.4567)
            assert retired_at == [] and runner.record.lifecycle.value == "draining"
            pool.policy.release(held, Outcome.OK, trio.current_time())
            released_at = trio.current_time()
        assert retired_at == [released_at]


async def test_one_reload_lock_for_the_file_reloader_and_the_python_api(
    fake_worker, configs, tmp_path, autojump_clock
):
    cfg = configs.config_with(("primary", configs.cpu(1)))
    path = tmp_path / "config.yaml"
    async with router(cfg, fake_worker, tmp_path) as core:
        await core.wait_ready(5)
        adopted: list = []
        reloader = ConfigReloader(
            core, path, current=cfg, adopt=adopted.append, events=RecordingSink()
        )
        fake_worker.behaviour["load_s"] = 2.0
        two, three = (
            configs.config_with(("primary", configs.cpu(2))),
            configs.config_with(("primary", configs.cpu(3))),
        )
        path.write_text(dump_config(three))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(core.reload, two, timeout_s=5))  # Python API
            await trio.sleep(0.5)
            assert core.reloading
            with pytest.raises(ReloadInProgress):
                await reloader.reload()  # refused, not queued
        assert not core.reloading and len(core.pools["primary"].runners) == 2 and adopted == []

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reloader.reload)
            await trio.sleep(0.5)
            assert core.reloading
            with pytest.raises(ReloadInProgress):
                await reloader.reload()
            await core.reload(two, timeout_s=5)  # the Python API waits its turn
            assert [len(c.deployments["primary"].placements()) for c in adopted] == [3]
        assert len(core.pools["primary"].runners) == 2 and not core.reloading
