"""A worker's spans, when it was started with traces on and a request carries `traceparent`.

The router's hop sends W3C `traceparent` only when its traces are on (sr.pool.dispatch_trace);
a worker started with traces on (its settings name a collector: sr.traces) then records the
request's clock readings (sr.worker.timing: `RequestTiming.forwards` is a list only then) and,
once the answer is ready, writes them as spans under the router's hop:

    POST /v1/embeddings   server span: route, status, request id, deployment, tokens
      tokenize            taking the request until its rows reach the engine
      queue               its rows waiting for the first forward holding one of them
      forward             each forward holding its rows: batch rows, padded tokens and the
                          requests sharing it (one span per forward)

The spans are made after the fact from readings the request takes anyway (a few clock
reads), with explicit start and end times, so nothing in the engine's loop waits on the
SDK; they leave in batches from the SDK's thread (sr.traces). Without a `traceparent`, or
with traces off, nothing here runs.
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import trace

from sr.traces import TraceSettings, Tracing, open_tracing, parent_context
from sr.worker.timing import RequestTiming

WORKER_SERVICE_SUFFIX = "-worker"  # `sr` -> `sr-worker`: its own row in a trace view


class WorkerTracing:
    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing
        self._tracer = tracing.tracer

    @classmethod
    def open(cls, settings: TraceSettings, attributes: dict[str, str]) -> WorkerTracing:
        name = settings.service_name + WORKER_SERVICE_SUFFIX
        return cls(open_tracing(settings, service_name=name, attributes=attributes))

    def record(
        self,
        traceparent: str,
        path: str,
        timing: RequestTiming,
        status: int,
        *,
        request_id: str | None,
        deployment: str | None,
    ) -> None:
        """The request's spans, from `timing` (perf_counter readings) and its answer."""
        parent = parent_context(traceparent)
        if parent is None or not trace.get_current_span(parent).get_span_context().is_valid:
            return  # a malformed traceparent: nothing to join
        now = time.perf_counter()
        offset_ns = time.time_ns() - int(now * 1e9)  # perf_counter seconds -> epoch ns

        def ns(seconds: float) -> int:
            return offset_ns + int(seconds * 1e9)

        attributes: dict[str, Any] = {
            "http.request.method": "POST",
            "http.route": path,
            "http.response.status_code": status,
            "sr.tokens": timing.tokens,
        }
        if request_id:
            attributes["sr.request_id"] = request_id
        if deployment:
            attributes["sr.deployment"] = deployment
        server = self._tracer.start_span(
            f"POST {path}",
            context=parent,
            kind=trace.SpanKind.SERVER,
            attributes=attributes,
            start_time=ns(timing.started),
        )
        if status >= 500:
            server.set_status(trace.StatusCode.ERROR)
        under = trace.set_span_in_context(server)
        reached = timing.reached_engine if timing.reached_engine is not None else now
        self._span("tokenize", under, ns(timing.started), ns(reached),
                   {"sr.characters": timing.characters})  # fmt: skip
        forwards = timing.forwards or []
        if forwards and timing.reached_engine is not None:
            first = min(started for started, *_ in forwards)
            self._span("queue", under, ns(timing.reached_engine), ns(max(first, reached)), {})
        for started, seconds, rows, padded, requests in forwards:
            self._span(
                "forward",
                under,
                ns(started),
                ns(started + seconds),
                {
                    "sr.batch.rows": rows,
                    "sr.batch.padded_tokens": padded,
                    "sr.batch.requests": requests,
                },
            )
        server.end(end_time=ns(now))

    def _span(self, name: str, parent: Any, start: int, end: int, attrs: dict[str, Any]) -> None:
        span = self._tracer.start_span(name, context=parent, attributes=attrs, start_time=start)
        span.end(end_time=max(start, end))

    def shutdown(self) -> None:
        self.tracing.shutdown()
