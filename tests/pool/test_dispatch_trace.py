"""The pool's spans of a traced request (sr.pool.dispatch_trace): dispatch, admission and
the hop under the router's span, the hop's `traceparent` sent to the worker, and a retry on
another replica shown as a second attempt; collected by the SDK's in-memory exporter."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sr.errors import WorkerFailed
from sr.events import RecordingSink
from sr.pool import open_router
from sr.pool.dispatch_trace import DispatchTrace


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), exporter


def router(config, fake_worker, tmp_path):
    return open_router(
        config, events=RecordingSink(), in_process=True, threads=2,
        run_dir=tmp_path / "run", worker_factory=fake_worker,
    )  # fmt: skip


def by_name(exporter) -> dict[str, list]:
    found: dict[str, list] = {}
    for span in exporter.get_finished_spans():
        found.setdefault(span.name, []).append(span)
    return found


async def test_dispatch_admission_and_hop_under_the_routers_span(
    fake_worker, configs, tmp_path, autojump_clock, spans
):
    tracer, exporter = spans
    cfg = configs.config_with(("d", configs.cpu(1)))
    async with router(cfg, fake_worker, tmp_path) as core:
        await core.wait_ready(5)
        server = tracer.start_span("POST /v1/embeddings")
        reply = await core.request_raw(
            "d", "/v1/embeddings", b"{}", trace=DispatchTrace(tracer, server)
        )
        server.end()
    assert reply.status == 200
    found = by_name(exporter)
    (dispatch,), (admission,), (hop,) = found["dispatch"], found["admission"], found["hop"]
    assert dispatch.parent.span_id == server.context.span_id
    assert admission.parent.span_id == hop.parent.span_id == dispatch.context.span_id
    assert admission.attributes["sr.replica"] == hop.attributes["sr.replica"] == reply.replica_id
    assert hop.attributes["http.response.status_code"] == 200
    assert dispatch.attributes["sr.attempts"] == 1
    # what the worker got is the hop's context, as the SDK's own W3C propagator writes it
    carrier: dict[str, str] = {}
    hop_context = trace.set_span_in_context(trace.NonRecordingSpan(hop.context))
    TraceContextTextMapPropagator().inject(carrier, hop_context)
    (worker,) = fake_worker.instances
    assert worker.traceparents == [carrier["traceparent"]]


async def test_a_retry_is_a_second_attempt_with_its_own_hop(
    fake_worker, configs, tmp_path, autojump_clock, spans
):
    tracer, exporter = spans
    cfg = configs.config_with(("d", configs.cpu(2)))
    async with router(cfg, fake_worker, tmp_path) as core:
        await core.wait_ready(5)
        await trio.sleep(1)  # both replicas ready
        fake_worker.behaviour["mode"] = "die_once"
        server = tracer.start_span("POST /v1/embeddings")
        reply = await core.request_raw(
            "d", "/v1/embeddings", b"{}", trace=DispatchTrace(tracer, server)
        )
    assert reply.status == 200
    found = by_name(exporter)
    (dispatch,) = found["dispatch"]
    assert dispatch.attributes["sr.attempts"] == 2
    assert [event.name for event in dispatch.events] == ["retry"]
    first, second = sorted(found["hop"], key=lambda span: span.attributes["sr.attempt"])
    assert first.attributes["sr.retry"] is False and second.attributes["sr.retry"] is True
    assert first.attributes["sr.outcome"] == "failed" and not first.status.is_ok
    assert second.attributes["http.response.status_code"] == 200
    assert first.attributes["sr.replica"] != second.attributes["sr.replica"]


async def test_a_dispatch_that_fails_records_the_error(
    fake_worker, configs, tmp_path, autojump_clock, spans
):
    tracer, exporter = spans
    cfg = configs.config_with(("d", configs.cpu(1)))
    async with router(cfg, fake_worker, tmp_path) as core:
        await core.wait_ready(5)
        fake_worker.behaviour["mode"] = "fail"
        with pytest.raises(WorkerFailed):
            await core.request_raw(
                "d", "/v1/embeddings", b"{}",
                trace=DispatchTrace(tracer, tracer.start_span("server")),
            )  # fmt: skip
    (dispatch,) = by_name(exporter)["dispatch"]
    assert dispatch.attributes["error.type"] == "WorkerFailed"
    assert not dispatch.status.is_ok
