"""The worker's timing (its one `x-sr-timing` header, read as TEI's headers and units) and
its /metrics text: probes counted apart, forward durations, no `_created` series."""

from __future__ import annotations

import json
import threading

import trio
import trio.testing
from worker_fakes import fake_service_kwargs, get, post, running

from sr.worker.options import WorkerOptions
from sr.worker.timing import TIMING_KEY, RequestTiming, WorkerTiming
from tests.metrics_text import named, needs_promtool, promtool_check, samples

# text-embeddings-inference's router (ResponseMetadata -> HeaderMap): whole milliseconds,
# and the request's tokens.
TEI_HEADERS = (
    "x-compute-time", "x-compute-tokens", "x-total-time", "x-tokenization-time",
    "x-queue-time", "x-inference-time", "x-compute-characters",
)  # fmt: skip
HOLD_S = 0.3


def fake_worker(model):
    return running(WorkerOptions(artifact="fake"), **fake_service_kwargs(model))


async def answer(service, path: str, body: dict) -> tuple[int, dict[str, str], dict]:
    status, headers, payload = await service.handle("POST", path, json.dumps(body).encode())
    return status, {k.decode(): v.decode() for k, v in headers}, json.loads(payload)


def timing_of(headers: dict[str, str]) -> dict[str, int]:
    """TEI's headers as the router writes them from the worker's `x-sr-timing`; the worker
    itself answers none of TEI's seven."""
    assert not set(headers) & set(TEI_HEADERS), headers
    timing = WorkerTiming.read(headers)
    assert timing is not None, headers
    tei = {name.decode(): value.decode() for name, value in timing.tei_headers()}
    assert list(tei) == list(TEI_HEADERS) and all(v.isdigit() for v in tei.values()), tei
    return {name: int(value) for name, value in tei.items()}


async def test_every_task_answer_carries_the_tei_timing_headers(fake_model):
    bodies = {
        "/v1/embeddings": {"input": ["a b", "c d e"]},
        "/v1/classify": {"input": ["good day"], "labels": {"pos": "happy", "neg": "sad"}},
        "/v1/decisions": {
            "state": "the door is open",
            "questions": {"q": {"type": "choice", "criteria": {"a": "open", "b": "shut"}}},
        },
    }
    async with fake_worker(fake_model) as service:
        for path, body in bodies.items():
            status, headers, payload = await answer(service, path, body)
            assert status == 200, payload
            times = timing_of(headers)
            assert times["x-compute-tokens"] == payload["usage"]["prompt_tokens"] > 0
            assert times["x-total-time"] == times["x-compute-time"]
            phases = ("x-tokenization-time", "x-queue-time", "x-inference-time")
            assert sum(times[name] for name in phases) <= times["x-total-time"]
            if path == "/v1/embeddings":
                assert times["x-compute-characters"] == len("a b") + len("c d e")


async def test_errors_and_reads_carry_no_timing_headers(fake_model):
    async with fake_worker(fake_model) as service:
        status, headers, _ = await answer(service, "/v1/embeddings", {"input": []})
        assert status == 400
        assert TIMING_KEY not in headers
        for path in ("/health", "/v1/models", "/metrics"):
            _, raw, _ = await service.handle("GET", path, b"")
            assert TIMING_KEY not in {k.decode() for k, _ in raw}


async def test_only_answers_whose_rows_reached_the_engine_are_timed(worker):
    status, headers, payload = await answer(worker, "/v1/embeddings", {"input": "hello world"})
    assert status == 200
    assert timing_of(headers)["x-compute-tokens"] == payload["usage"]["prompt_tokens"] == 4
    status, headers, _ = await answer(worker, "/v1/tokenize", {"input": "hello world"})
    assert status == 200  # no forward: nothing to time, as TEI's /tokenize
    assert TIMING_KEY not in headers


async def test_queue_and_inference_times_follow_the_device(fake_model):
    """A request held in its forward for HOLD_S shows it as inference time; one that waits
    behind it shows it as queue time."""
    answers: dict[str, tuple] = {}
    async with fake_worker(fake_model) as service:
        fake_model.gate = threading.Event()

        async def one(key: str, text: str) -> None:
            answers[key] = await answer(service, "/v1/embeddings", {"input": text})

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(one, "held", "hold the device")
                # Every task waits: the held request's forward is with the device thread.
                await trio.testing.wait_all_tasks_blocked(cushion=0.02)
                nursery.start_soon(one, "waiting", "waits behind it")
                while service.engine.queued_rows == 0:
                    await trio.sleep(0.01)
                await trio.sleep(HOLD_S)
                fake_model.gate.set()
    held, waiting = timing_of(answers["held"][1]), timing_of(answers["waiting"][1])
    hold_ms = int(HOLD_S * 1000)
    assert held["x-inference-time"] >= hold_ms * 0.9  # its forward began as the hold did
    assert waiting["x-queue-time"] >= hold_ms
    assert waiting["x-inference-time"] < hold_ms
    assert held["x-queue-time"] < hold_ms


def test_milliseconds_are_cut_down_as_tei_cuts_them():
    timing = RequestTiming()
    timing.started = 100.0
    timing.add_submission(100.0105, 100.0114, 0.0025, tokens=7)
    timing.add_submission(100.0300, None, 0.0, tokens=2)  # every row from the cache
    timing.characters = 31
    name, value = timing.header(now=100.0209)
    assert name == b"x-sr-timing"
    microseconds = [int(field) for field in value.split()]
    expected = [20900, 10500, 900, 2500, 9, 31]
    assert all(abs(a - b) <= 1 for a, b in zip(microseconds, expected, strict=True)), value
    worker_answer = {name.decode(): value.decode(), "content-type": "application/json"}
    assert timing_of(worker_answer) == {
        "x-compute-time": 20,
        "x-compute-tokens": 9,
        "x-total-time": 20,
        "x-tokenization-time": 10,
        "x-queue-time": 0,  # 0.9 ms
        "x-inference-time": 2,
        "x-compute-characters": 31,
    }


def test_a_malformed_timing_header_is_no_timing():
    """An attached worker of another version, or a proxy's mangling, costs no answer."""
    for value in ("20 10 0 2 9", "20 10 0 2 9 31 7", "20 10 -1 2 9 31", "a b c d e f", "", "²"):
        assert WorkerTiming.read({TIMING_KEY: value}) is None, value
    assert WorkerTiming.read({}) is None


async def test_probes_and_scrapes_are_counted_apart_from_requests(fake_model):
    async with fake_worker(fake_model) as service:
        assert (await post(service, "/v1/embeddings", {"input": ["a", "b c"]}))[0] == 200
        for path in ("/health", "/health/live", "/health"):
            assert (await get(service, path))[0] == 200
        await service.handle("GET", "/metrics", b"")
        _, _, text = await service.handle("GET", "/metrics", b"")
    found = samples(text.decode())
    assert named(found, "sr_worker_requests_total") == {
        (("route", "/v1/embeddings"), ("status", "200")): 1.0
    }
    assert named(found, "sr_worker_probes_total") == {
        (("route", "/health"), ("status", "200")): 2.0,
        (("route", "/health/live"), ("status", "200")): 1.0,
        (("route", "/metrics"), ("status", "200")): 1.0,  # this scrape counts once answered
    }


async def _text_after_two_forwards(fake_model) -> str:
    async with fake_worker(fake_model) as service:
        for text in ("one", "two three"):
            assert (await post(service, "/v1/embeddings", {"input": text}))[0] == 200
        _, _, raw = await service.handle("GET", "/metrics", b"")
    return raw.decode()


async def test_forward_durations_and_no_created_series(fake_model):
    text = await _text_after_two_forwards(fake_model)
    found = samples(text)
    assert "_created" not in text
    assert found[("sr_worker_forwards_total", ())] == 2
    assert found[("sr_worker_forward_seconds_count", ())] == 2
    assert found[("sr_worker_forward_seconds_sum", ())] > 0
    assert found[("sr_worker_batch_rows_sum", ())] == 2
    assert found[("sr_worker_queued_rows", ())] == 0


@needs_promtool
async def test_promtool_accepts_the_workers_text(fake_model):
    promtool_check(await _text_after_two_forwards(fake_model))


def test_the_text_is_what_prometheus_clients_own_series_wrote():
    # Answers folded on a scrape and every FOLD_EVERY, forwards in plain counts: the same
    # text, to the bit, as the Counter and Histogram objects given each value at once.
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    from sr import exposition
    from sr.worker import metrics as worker_metrics

    reference = CollectorRegistry()
    requests = Counter("sr_worker_requests", "HTTP requests answered, probes aside",
                       ["route", "status"], registry=reference)  # fmt: skip
    probes = Counter("sr_worker_probes", "Health probes and metrics scrapes answered",
                     ["route", "status"], registry=reference)  # fmt: skip
    rows = Counter("sr_worker_rows", "rows computed by forwards", registry=reference)
    forwards = Counter("sr_worker_forwards", "batched forwards run", registry=reference)
    histograms = [
        Histogram(name, doc, buckets=buckets, registry=reference)
        for name, doc, buckets in (
            ("sr_worker_batch_rows", "rows per forward", worker_metrics._BATCH_ROW_BUCKETS),
            ("sr_worker_batch_padded_tokens", "padded tokens per forward",
             worker_metrics._PADDED_TOKEN_BUCKETS),
            ("sr_worker_batch_requests", "requests sharing a forward",
             worker_metrics._BATCH_ROW_BUCKETS),
            ("sr_worker_forward_seconds", "time of one batched forward on the device thread",
             worker_metrics.FORWARD_SECONDS_BUCKETS),
        )
    ]  # fmt: skip
    queued = Gauge("sr_worker_queued_rows", "rows waiting for a forward", registry=reference)
    queued.set_function(lambda: 3)
    metrics = worker_metrics.WorkerMetrics()
    metrics.watch_queue(lambda: 3)
    routes = ["/v1/embeddings", "/health", "/metrics", "other", "/v1/rerank"]
    for number in range(worker_metrics.FOLD_EVERY * 2 + 37):
        forward = (number % 300 + 1, (number * 7) % 70000, number % 5 + 1, number * 0.000731)
        metrics.observe_forward(*forward)
        rows.inc(forward[0])
        forwards.inc()
        for histogram, value in zip(histograms, forward, strict=True):
            histogram.observe(value)
        route, status = routes[number % len(routes)], 200 if number % 3 else 503
        metrics.count_answer(route, status)
        family = probes if route in worker_metrics.PROBE_ROUTES else requests
        family.labels(route, str(status)).inc()
        if number in (0, 5, worker_metrics.FOLD_EVERY + 1):
            assert metrics.render() == exposition.render(reference)
    assert metrics.render() == exposition.render(reference)
    assert metrics.render() == exposition.render(reference)  # a scrape changes nothing


def test_the_header_cuts_each_time_down_to_whole_microseconds():
    import random

    generator = random.Random(7)
    for _ in range(2000):
        timing = RequestTiming()
        timing.started = generator.uniform(0.0, 1e5)
        submitted = timing.started + generator.expovariate(100.0)
        timing.add_submission(
            submitted, submitted + generator.expovariate(1000.0), generator.expovariate(50.0), 3
        )
        now = submitted + generator.expovariate(20.0)
        parts = (now - timing.started, submitted - timing.started, timing.queue_s,
                 timing.inference_s)  # fmt: skip
        expected = " ".join(str(int(seconds * 1_000_000.0)) for seconds in parts) + " 3 0"
        assert timing.header(now=now)[1].decode() == expected
