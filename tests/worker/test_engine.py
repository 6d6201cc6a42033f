"""The batching engine against a fake model whose forwards can be held and counted."""

from __future__ import annotations

import contextlib
import threading

import pytest
import trio
from worker_fakes import FakeModel

from sr.errors import ForwardFailed
from sr.worker import engine as engine_module
from sr.worker.batching import Limits
from sr.worker.device_thread import DeviceThread
from sr.worker.engine import INLINE_FORWARD_TOKENS, Engine
from sr.worker.threads import ForwardRunner


@contextlib.asynccontextmanager
async def engine_for(model, *, cross_request=True, seqs=64, tokens=8192, cache_rows=0):
    device = DeviceThread()
    engine = Engine(
        model,
        device,
        ForwardRunner(1),
        Limits(seqs, tokens, 64, "configured"),
        cross_request=cross_request,
        cache_rows=cache_rows,
    )
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(engine.run)
            yield engine
            nursery.cancel_scope.cancel()
    finally:
        device.stop()


async def held_then_concurrent(engine, model, requests):
    """Hold the device with a first request, queue `requests`, release; answers in order."""
    model.gate = threading.Event()
    answers = {}

    async def one(key, rows):
        answers[key] = await engine.compute("embed", rows)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, "first", model.tokenize(["hold the device"]))
            await trio.sleep(0.05)
            for i, rows in enumerate(requests):
                nursery.start_soon(one, i, rows)
            while engine.queued_rows < sum(len(r) for r in requests):
                await trio.sleep(0.01)
            model.gate.set()
    return answers


async def test_concurrent_requests_share_one_forward_when_cross_request():
    model = FakeModel()
    requests = [model.tokenize([f"request {i}", "x y"]) for i in range(4)]
    async with engine_for(model) as engine:
        answers = await held_then_concurrent(engine, model, requests)
    assert len(model.batches) == 2  # the held forward, then all 8 queued rows together
    assert sorted(model.batches[1]) == sorted(len(r) for rows in requests for r in rows)
    alone = FakeModel()
    for i, rows in enumerate(requests):
        assert answers[i] == alone.embed(rows).tolist()


async def test_without_cross_request_each_forward_holds_one_request():
    model = FakeModel()
    requests = [model.tokenize([f"request {i}", "x y z"]) for i in range(3)]
    async with engine_for(model, cross_request=False) as engine:
        answers = await held_then_concurrent(engine, model, requests)
    assert len(model.batches) == 4  # held + one per request, each with its own two rows
    assert all(len(b) == 2 for b in model.batches[1:])
    for i, rows in enumerate(requests):
        assert answers[i] == FakeModel().embed(rows).tolist()


async def test_a_large_request_is_split_within_the_limits():
    model = FakeModel()
    rows = model.tokenize([" ".join([f"w{i}"] * (1 + i % 7)) for i in range(20)])
    async with engine_for(model, seqs=6, tokens=30) as engine:
        with trio.fail_after(10):
            answers = await engine.compute("embed", rows)
    assert len(model.batches) > 3
    assert all(len(b) <= 6 and len(b) * max(b) <= 30 for b in model.batches)
    assert sum(map(len, model.batches)) == 20
    assert answers == [FakeModel().embed([r]).tolist()[0] for r in rows]


async def test_identical_rows_are_computed_once_and_cache_answers_repeats():
    model = FakeModel()
    rows = model.tokenize(["same", "same", "other"])
    async with engine_for(model, cache_rows=16) as engine:
        with trio.fail_after(10):
            first = await engine.compute("embed", rows)
            second = await engine.compute("embed", rows[:1])
    assert model.batches == [[3, 3]]  # "same" once, "other" once; the repeat hit the cache
    assert first[0] == first[1] == second[0]
    assert engine.cache.hits == 1


async def test_a_failing_forward_fails_its_request_and_the_engine_keeps_serving():
    model = FakeModel()
    model.fail_next = True
    async with engine_for(model) as engine:
        with trio.fail_after(10):
            with pytest.raises(ForwardFailed, match="boom"):
                await engine.compute("embed", model.tokenize(["a"]))
            rows = model.tokenize(["a"])
            assert await engine.compute("embed", rows) == FakeModel().embed(rows).tolist()


async def test_abandoned_requests_are_not_computed():
    model = FakeModel()
    model.gate = threading.Event()
    async with engine_for(model, cross_request=False) as engine:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(engine.compute, "embed", model.tokenize(["first"]))
                await trio.sleep(0.05)
                with trio.move_on_after(0.05):
                    await engine.compute("embed", model.tokenize(["gave up"]))
                model.gate.set()
    assert model.batches == [[3]]


async def test_an_idle_engine_forwards_from_the_callers_task():
    # No serving task at all: an idle engine's caller runs its own forwards, cut into the
    # batches a window of that one request gets.
    model = FakeModel()
    rows = model.tokenize([" ".join([f"w{i}"] * (1 + i % 5)) for i in range(9)])
    device = DeviceThread()
    try:
        engine = Engine(model, device, ForwardRunner(1), Limits(4, 30, 64, "configured"),
                        cross_request=True, cache_rows=0)  # fmt: skip
        with trio.fail_after(10):
            answers = await engine.compute("embed", rows)
    finally:
        device.stop()
    assert answers == [FakeModel().embed([r]).tolist()[0] for r in rows]
    assert all(len(b) <= 4 and len(b) * max(b) <= 30 for b in model.batches)
    assert sum(map(len, model.batches)) == 9
    assert not engine._busy and engine.forwards == len(model.batches)


async def test_requests_arriving_during_a_callers_own_forward_queue_for_the_serving_task():
    model = FakeModel()
    requests = [model.tokenize([f"request {i}", "x y"]) for i in range(3)]
    async with engine_for(model) as engine:
        answers = await held_then_concurrent(engine, model, requests)
        # the engine is idle again: the next request runs alone, from its caller
        rows = model.tokenize(["after"])
        assert await engine.compute("embed", rows) == FakeModel().embed(rows).tolist()
    assert [len(b) for b in model.batches] == [1, 6, 1]  # held, the three together, after
    for i, rows in enumerate(requests):
        assert answers[i] == FakeModel().embed(rows).tolist()


async def test_a_caller_cancelled_during_its_own_forward_leaves_the_engine_serving():
    model = FakeModel()
    model.gate = threading.Event()
    async with engine_for(model) as engine:
        with trio.fail_after(10):
            with trio.move_on_after(0.05) as gave_up:
                await engine.compute("embed", model.tokenize(["gave up"]))
            assert gave_up.cancelled_caught and not engine._busy
            model.gate.set()  # the abandoned forward still runs on the device thread
            rows = model.tokenize(["next"])
            assert await engine.compute("embed", rows) == FakeModel().embed(rows).tolist()


async def test_a_caller_cancelled_while_its_work_is_queued_on_the_device_thread():
    # The device thread's rules: the cancelled caller stops waiting at once, its queued
    # work still runs in order, and its outcome goes nowhere; later callers are answered.
    device = DeviceThread()
    release = threading.Event()
    ran = []
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(device.run, lambda: release.wait(10) and ran.append("held"))
                await trio.sleep(0.05)
                with trio.move_on_after(0.05) as gave_up:
                    await device.run(lambda: ran.append("queued") or "unseen")
                assert gave_up.cancelled_caught and ran == []
                release.set()
            assert await device.run(lambda: ran.append("later") or "answer") == "answer"
            assert ran == ["held", "queued", "later"]
    finally:
        device.stop()


class ThreadNotingModel(FakeModel):
    """Notes the thread each forward ran on."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def embed(self, batch):
        self.threads.append(threading.current_thread().name)
        return super().embed(batch)


def inline_engine(model, device):
    limits = Limits(64, 8192, 64, "configured")
    return Engine(model, device, ForwardRunner(1), limits, cross_request=True, cache_rows=0,
                  inline_tokens=INLINE_FORWARD_TOKENS)  # fmt: skip


async def test_a_short_forward_of_an_idle_engine_runs_on_the_callers_thread():
    model = ThreadNotingModel()
    device = DeviceThread(name="device")
    try:
        engine = inline_engine(model, device)
        rows = model.tokenize(["a short text"])
        with trio.fail_after(10):
            first = await engine.compute("embed", rows)
            second = await engine.compute("embed", rows)
        long_rows = model.tokenize([" ".join(["w"] * INLINE_FORWARD_TOKENS)])
        with trio.fail_after(10):
            await engine.compute("embed", long_rows)
    finally:
        device.stop()
    assert first == second == FakeModel().embed(rows).tolist()
    here = threading.current_thread().name
    # the first on the device thread (no forward timed yet), the next short one on the
    # caller's thread, one past the token cap on the device thread
    assert model.threads == ["device", here, "device"]
    assert device.in_flight == 0


async def test_after_a_slow_forward_the_next_goes_to_the_device_thread(monkeypatch):
    model = ThreadNotingModel()
    device = DeviceThread(name="device")
    monkeypatch.setattr(engine_module, "INLINE_FORWARD_S", 0.0)  # every forward is "slow"
    try:
        engine = inline_engine(model, device)
        rows = model.tokenize(["a short text"])
        with trio.fail_after(10):
            for _ in range(3):
                await engine.compute("embed", rows)
    finally:
        device.stop()
    assert model.threads == ["device", "device", "device"]


async def test_no_forward_runs_inline_beside_an_abandoned_one_still_on_the_device_thread():
    # A caller that gave up leaves its forward running on the device thread; the next
    # request waits behind it there, so two forwards never run at once.
    model = ThreadNotingModel()
    model.gate = threading.Event()
    device = DeviceThread(name="device")
    try:
        engine = inline_engine(model, device)
        with trio.fail_after(10):
            with trio.move_on_after(0.05) as gave_up:
                await engine.compute("embed", model.tokenize(["gave up"]))
            assert gave_up.cancelled_caught and device.in_flight == 1
            engine._last_forward_s = 0.0
            async with trio.open_nursery() as nursery:
                nursery.start_soon(engine.compute, "embed", model.tokenize(["next"]))
                await trio.sleep(0.05)
                assert model.threads == ["device"]  # the next is queued behind the held one
                model.gate.set()
    finally:
        device.stop()
    assert model.threads == ["device", "device"]


async def test_requests_arriving_together_at_an_idle_inline_engine_share_forwards():
    model = ThreadNotingModel()
    device = DeviceThread(name="device")
    requests = [model.tokenize([f"request {i}"]) for i in range(8)]
    answers = {}
    try:
        engine = inline_engine(model, device)

        async def one(i):
            answers[i] = await engine.compute("embed", requests[i])

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(engine.run)
                async with trio.open_nursery() as burst:
                    for i in range(len(requests)):
                        burst.start_soon(one, i)
                nursery.cancel_scope.cancel()
    finally:
        device.stop()
    assert [answers[i] for i in range(8)] == [FakeModel().embed(r).tolist() for r in requests]
    # the first on the device thread, the seven queued meanwhile in one forward after it
    # (a short one too, which the serving task may run inline: its thread is not asserted)
    assert [len(b) for b in model.batches] == [1, 7]
    assert model.threads[0] == "device"
