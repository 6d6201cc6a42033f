"""A worker's spans (sr.worker.tracing): made only for a request that carries a
`traceparent` to a worker started with traces on, under the caller's span, from the
request's own clock readings; the SDK's in-memory exporter collects them here."""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from worker_fakes import fake_service_kwargs, running

from sr.http.hop import Hop
from sr.traces import TraceSettings, Tracing
from sr.worker.cli import parse_command
from sr.worker.options import WorkerOptions
from sr.worker.tracing import WorkerTracing

TRACE_ID, PARENT = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT}-01"


def in_memory() -> tuple[WorkerTracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    processor = SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    return WorkerTracing(Tracing(provider.get_tracer("test"), processor, "sr-worker")), exporter


async def embed(service, traceparent: str | None) -> int:
    body = json.dumps({"input": ["one", "two three"]}).encode()
    hop = Hop("rid-1", "primary", traceparent)
    status, _, _ = await service.handle("POST", "/v1/embeddings", body, hop)
    return status


async def test_a_traced_request_gets_its_spans_under_the_callers(fake_model):
    async with running(WorkerOptions(artifact="fake"), **fake_service_kwargs(fake_model)) as svc:
        svc.tracing, exporter = in_memory()
        assert await embed(svc, TRACEPARENT) == 200
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert set(spans) == {"POST /v1/embeddings", "tokenize", "queue", "forward"}
    server = spans["POST /v1/embeddings"]
    assert f"{server.context.trace_id:032x}" == TRACE_ID
    assert f"{server.parent.span_id:016x}" == PARENT
    assert server.attributes["sr.request_id"] == "rid-1"
    assert server.attributes["sr.deployment"] == "primary"
    assert server.attributes["http.response.status_code"] == 200
    for name in ("tokenize", "queue", "forward"):
        span = spans[name]
        assert span.parent.span_id == server.context.span_id
        assert server.start_time <= span.start_time <= span.end_time <= server.end_time
    assert spans["forward"].attributes["sr.batch.rows"] == 2
    assert spans["forward"].attributes["sr.batch.requests"] == 1
    assert spans["tokenize"].end_time <= spans["queue"].end_time <= spans["forward"].end_time


@pytest.mark.parametrize("traceparent", [None, "00-zz-yy-01", f"00-{'0' * 32}-{PARENT}-01"])
async def test_no_spans_without_a_valid_traceparent(fake_model, traceparent):
    async with running(WorkerOptions(artifact="fake"), **fake_service_kwargs(fake_model)) as svc:
        svc.tracing, exporter = in_memory()
        assert await embed(svc, traceparent) == 200
    assert exporter.get_finished_spans() == ()


async def test_traces_off_ignores_a_traceparent(fake_model):
    async with running(WorkerOptions(artifact="fake"), **fake_service_kwargs(fake_model)) as svc:
        assert svc.tracing is None
        assert await embed(svc, TRACEPARENT) == 200


def test_sr_worker_takes_its_trace_settings_from_its_environment(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:4318/v1/traces")
    options = parse_command(["--artifact", "a", "--uds", "/run/w.sock"]).options
    assert options.traces == TraceSettings(endpoint="http://127.0.0.1:4318/v1/traces")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    assert parse_command(["--artifact", "a", "--uds", "/run/w.sock"]).options.traces is None
