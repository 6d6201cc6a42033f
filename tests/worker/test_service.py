"""Worker states, golden gating, the model card, and fault injection (in-process)."""

from __future__ import annotations

import threading

import trio
from worker_fakes import FakeModel, GoldenResult, fake_service_kwargs, get, post, running

from sr.errors import ArtifactNotFound
from sr.worker.options import WorkerOptions
from sr.worker.service import WorkerService
from sr.worker.state import WorkerState


async def test_health_walks_through_loading_to_ready(fake_model):
    loaded = threading.Event()

    def slow_load(options):
        loaded.wait(timeout=10)
        return fake_model

    service = WorkerService(
        WorkerOptions(artifact="fake"),
        load_model_fn=slow_load,
        golden_check_fn=lambda m: GoldenResult(),
    )
    assert (await get(service, "/health")) == (503, {"status": "starting", "reason": None})
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        assert (await get(service, "/health"))[1]["status"] == "loading"
        assert (await post(service, "/v1/embeddings", {"input": "x"}))[0] == 503
        assert (await get(service, "/health/live"))[0] == 200
        loaded.set()
        with trio.fail_after(10):
            await service.wait_settled()
        assert await get(service, "/health") == (200, {"status": "ready"})
        nursery.cancel_scope.cancel()


async def test_failed_golden_check_keeps_the_worker_unready(fake_model):
    failing = GoldenResult(status="failed", reason="answer drifted", max_abs_diff=0.5)
    opts = WorkerOptions(artifact="fake")
    async with running(
        opts, load_model_fn=lambda o: fake_model, golden_check_fn=lambda m: failing
    ) as svc:
        status, health = await get(svc, "/health")
        assert status == 503 and health["status"] == "failed"
        assert "golden check failed: answer drifted" in health["reason"]
        card = (await get(svc, "/v1/models"))[1]["data"][0]
        assert card["golden"] == {
            "status": "failed",
            "reason": "answer drifted",
            "max_abs_diff": 0.5,
            "min_cosine": None,  # the fake result measured none
            "against": None,
        }
        assert (await post(svc, "/v1/embeddings", {"input": "x"}))[0] == 503


async def test_missing_artifact_and_missing_device_fail_with_a_reason(fake_model):
    def not_found(options):
        raise ArtifactNotFound("looked in /nowhere")

    async with running(WorkerOptions(artifact="org/missing"), load_model_fn=not_found) as svc:
        assert svc.state is WorkerState.FAILED
        assert svc.reason == "artifact not found: looked in /nowhere"
    kwargs = fake_service_kwargs(fake_model)
    async with running(WorkerOptions(artifact="fake", device="cuda:7"), **kwargs) as svc:
        assert svc.state is WorkerState.FAILED and svc.reason.startswith(
            "device not available: cuda:7"
        )


async def test_card_reports_limits_probe_and_batching(fake_model):
    opts = WorkerOptions(artifact="org/fake", revision="abc", threads=2, max_num_seqs=8)
    async with running(opts, **fake_service_kwargs(fake_model)) as svc:
        status, models = await get(svc, "/v1/models")
    assert status == 200 and models["object"] == "list"
    card = models["data"][0]
    assert card["id"] == card["artifact"] == "org/fake"
    assert (card["revision"], card["device"], card["threads"], card["profile"]) == (
        "abc",
        "cpu",
        2,
        "exact",
    )
    assert card["weights_sha256"] == "f" * 64
    assert card["limits"] == {
        "max_num_seqs": 8,
        "max_num_batched_tokens": 8192,
        "max_input_tokens": 64,
        "source": "configured",
    }
    assert card["golden"]["status"] == "passed"
    assert card["batching"]["cross_request"] is True  # the fake model is batch-invariant
    assert card["batching"]["probe"]["passed"] is True
    assert card["adaptive_threads"]["configured_threads"] == 2
    assert card["state"] == "ready"


async def test_probe_failure_turns_cross_request_batching_off_under_exact():
    model = FakeModel(invariant=False)
    async with running(WorkerOptions(artifact="fake"), **fake_service_kwargs(model)) as svc:
        card = svc.card()
    assert card["batching"]["cross_request"] is False
    assert card["batching"]["probe"]["passed"] is False
    assert card["batching"]["cache_rows"] == 0  # answers depend on the batch: no cache
    model = FakeModel(invariant=False)
    opts = WorkerOptions(artifact="fake", profile="throughput")
    async with running(opts, **fake_service_kwargs(model)) as svc:
        assert svc.card()["batching"]["cross_request"] is True


async def test_metrics_count_requests_and_forwards(fake_model):
    async with running(WorkerOptions(artifact="fake"), **fake_service_kwargs(fake_model)) as svc:
        await post(svc, "/v1/embeddings", {"input": ["a b", "c"]})
        status, _, text = await svc.handle("GET", "/metrics", b"")
    text = text.decode()
    assert status == 200
    assert 'sr_worker_requests_total{route="/v1/embeddings",status="200"} 1.0' in text
    assert "sr_worker_forwards_total 1.0" in text
    assert "sr_worker_rows_total 2.0" in text


async def faulty(fake_model, exits):
    opts = WorkerOptions(artifact="fake", fault_injection=True)
    return running(opts, exit_process=exits.append, **fake_service_kwargs(fake_model))


async def test_fault_modes(fake_model):
    exits: list[int] = []
    async with await faulty(fake_model, exits) as svc:
        assert await get(svc, "/admin/faults") == (200, {"mode": "none", "slow_ms": 0})
        assert (await post(svc, "/admin/faults", {"mode": "explode"}))[0] == 400
        assert (await post(svc, "/admin/faults", {"mode": "fail"}))[0] == 200
        status, answer = await post(svc, "/v1/embeddings", {"input": "x"})
        assert status == 500 and answer["error"]["code"] == "worker_failed"

        await post(svc, "/admin/faults", {"mode": "slow", "slow_ms": 200})
        start = trio.current_time()
        assert (await post(svc, "/v1/embeddings", {"input": "x"}))[0] == 200
        assert trio.current_time() - start >= 0.2

        await post(svc, "/admin/faults", {"mode": "hang"})
        with trio.move_on_after(0.3) as hung:
            await post(svc, "/v1/embeddings", {"input": "x"})
        assert hung.cancelled_caught
        assert await get(svc, "/health") == (200, {"status": "ready"})
        await post(svc, "/admin/faults", {"mode": "none"})
        assert (await post(svc, "/v1/embeddings", {"input": "x"}))[0] == 200

        assert (await post(svc, "/admin/faults", {"mode": "exit"}))[0] == 200
        assert svc.exit_requested
        with trio.fail_after(5):
            while not exits:
                await trio.sleep(0.05)
    assert exits == [1]


async def test_hung_requests_resume_when_the_mode_changes(fake_model):
    async with await faulty(fake_model, []) as svc:
        await post(svc, "/admin/faults", {"mode": "hang"})
        answers = []

        async def call():
            answers.append(await post(svc, "/v1/embeddings", {"input": "x"}))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            await trio.sleep(0.1)
            assert answers == []
            await post(svc, "/admin/faults", {"mode": "none"})
        assert answers[0][0] == 200
