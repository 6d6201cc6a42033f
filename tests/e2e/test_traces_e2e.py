"""`sr serve --otlp-endpoint` with one worker (tiny BERT), exporting to an OTLP/HTTP
receiver started here (tests.otlp_receiver, decoding with opentelemetry-proto): a request
carrying a caller's `traceparent` gives one trace, the router's spans and the worker's under
them, with the expected parents and attributes; a receiver that hangs costs no request."""

from __future__ import annotations

import secrets

import pytest

from tests.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.serve_process import ServeProcess, serve_config

pytestmark = pytest.mark.e2e

SERVER, CLIENT = 2, 3  # opentelemetry.proto.trace.v1.Span.SpanKind
# The SDK's batch processor waits 5 s between exports by default; 100 ms keeps tests short.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}


def traced(tmp_path, model_dir, receiver_url: str, **env: str) -> ServeProcess:
    return ServeProcess(
        tmp_path,
        serve_config(model_dir, 1),
        env={**FAST_EXPORT, **env},
        args=["--otlp-endpoint", receiver_url],
    )


def caller_traceparent() -> str:
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def by_name(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [span for span in spans if span.name == name]


def test_one_trace_from_caller_through_router_into_worker(tmp_path, tiny_model_dir):
    trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    with OtlpReceiver() as receiver:
        server = traced(tmp_path, tiny_model_dir, receiver.url).start(timeout_s=60)
        try:
            reply = server.client.post(
                "/v1/embeddings",
                json={"model": "primary", "input": ["the cat sat", "on the mat"]},
                headers={"traceparent": f"00-{trace_id}-{caller_span}-01"},
            )
            assert reply.status_code == 200, reply.text
            names = {"POST /v1/embeddings", "dispatch", "admission", "hop", "tokenize", "queue",
                     "forward"}  # fmt: skip
            spans = receiver.wait_for(
                lambda found: (
                    names <= {s.name for s in found if s.trace_id == trace_id}
                    and len(by_name(found, "POST /v1/embeddings")) == 2
                ),
                timeout_s=20,
            )
        finally:
            assert server.stop() == []
    spans = [span for span in spans if span.trace_id == trace_id]
    (replica,) = {s.attributes.get("sr.replica") for s in by_name(spans, "admission")}
    servers = {s.service: s for s in by_name(spans, "POST /v1/embeddings") if s.kind == SERVER}
    router, worker = servers["sr"], servers["sr-worker"]
    # The router's server span is the caller's span's child, and names the request.
    assert router.parent_span_id == caller_span
    assert router.attributes["http.route"] == "/v1/embeddings"
    assert router.attributes["http.response.status_code"] == 200
    assert router.attributes["sr.deployment"] == "primary"
    assert router.attributes["sr.outcome"] == "ok"
    assert router.attributes["sr.request_id"] == reply.headers["x-request-id"]
    (dispatch,) = by_name(spans, "dispatch")
    assert dispatch.parent_span_id == router.span_id
    assert dispatch.attributes["sr.deployment"] == "primary"
    assert dispatch.attributes["sr.attempts"] == 1
    (admission,) = by_name(spans, "admission")
    assert admission.parent_span_id == dispatch.span_id
    assert replica == reply.headers["x-sr-replica"]
    (hop,) = by_name(spans, "hop")
    assert hop.kind == CLIENT
    assert hop.parent_span_id == dispatch.span_id
    assert hop.attributes["sr.replica"] == replica
    assert hop.attributes["http.response.status_code"] == 200
    assert hop.attributes["sr.retry"] is False
    # The worker's spans hang under the hop: its traceparent travelled to the worker.
    assert worker.parent_span_id == hop.span_id
    assert worker.attributes["sr.request_id"] == reply.headers["x-request-id"]
    assert worker.attributes["sr.deployment"] == "primary"
    assert worker.attributes["sr.tokens"] == reply.json()["usage"]["prompt_tokens"]
    for name in ("tokenize", "queue", "forward"):
        for span in by_name(spans, name):
            assert span.parent_span_id == worker.span_id, name
            assert span.service == "sr-worker"
            assert worker.start_ns <= span.start_ns <= span.end_ns <= worker.end_ns, name
    forwards = by_name(spans, "forward")
    assert sum(f.attributes["sr.batch.rows"] for f in forwards) == 2
    assert all(f.attributes["sr.batch.padded_tokens"] >= f.attributes["sr.batch.rows"]
               for f in forwards)  # fmt: skip
    (tokenize,) = by_name(spans, "tokenize")
    (queue,) = by_name(spans, "queue")
    assert tokenize.end_ns <= queue.start_ns + 1000  # tokenized, then queued (ns rounding)
    assert hop.start_ns <= worker.start_ns and worker.end_ns <= hop.end_ns
    assert router.start_ns <= hop.start_ns and hop.end_ns <= router.end_ns


def test_request_without_traceparent_starts_a_trace_of_its_own(tmp_path, tiny_model_dir):
    with OtlpReceiver() as receiver:
        server = traced(tmp_path, tiny_model_dir, receiver.url).start(timeout_s=60)
        try:
            reply = server.client.post("/v1/embeddings", json={"model": "primary", "input": "hi"})
            assert reply.status_code == 200, reply.text
            # The router and the worker export on their own schedules: wait for both.
            spans = receiver.wait_for(
                lambda found: (
                    {s.service for s in by_name(found, "forward")} == {"sr-worker"}
                    and {s.service for s in by_name(found, "POST /v1/embeddings")}
                    == {"sr", "sr-worker"}
                ),
                timeout_s=20,
            )
        finally:
            assert server.stop() == []
    (router,) = [s for s in by_name(spans, "POST /v1/embeddings") if s.service == "sr"]
    assert router.parent_span_id == ""  # a root: no caller's trace to join
    assert {s.trace_id for s in spans} == {router.trace_id}


def test_a_hung_collector_costs_no_request(tmp_path, tiny_model_dir):
    """The receiver takes each export and never answers: the SDK's exporting thread
    waits on it, while every request is answered (bounded: 60 requests, each with the
    client's 10 s timeout), and sr serve still stops cleanly."""
    with OtlpReceiver(hang=True) as receiver:
        server = traced(tmp_path, tiny_model_dir, receiver.url).start(timeout_s=60)
        try:
            for index in range(60):
                reply = server.client.post(
                    "/v1/embeddings",
                    json={"model": "primary", "input": f"text {index}"},
                    headers={"traceparent": caller_traceparent()},
                )
                assert reply.status_code == 200, reply.text
            receiver.wait_for(lambda _: receiver.exports_seen >= 1, timeout_s=20)
        finally:
            assert server.stop() == []
        assert server.proc is not None and server.proc.returncode == 0, server.logs()
