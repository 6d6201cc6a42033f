"""The router's traces, when they are on: one server span per request routed to a worker.

    POST /v1/embeddings      server span: route, deployment, status, outcome, request id;
      dispatch ...           the pool's spans under it (sr.pool.dispatch_trace), whose hop
                             carries `traceparent` to the worker (sr.worker.tracing)

A caller's W3C `traceparent` (and `tracestate`) is honoured: the server span is its child,
so sr's spans join the caller's trace; a malformed one starts a new trace, as the W3C rules
ask (the header is the caller's business, not a reason to refuse the request).

`sr.router.app` imports this module only when traces are on; with them off, its request
path checks one attribute for None.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace

from sr.http.asgi import request_headers
from sr.pool.dispatch_trace import DispatchTrace
from sr.traces import TraceSettings, Tracing, open_tracing, parent_context

_TRACEPARENT = b"traceparent"
_TRACESTATE = b"tracestate"


class RouterTracing:
    """Starts a `RequestTrace` per routed request; `shutdown` sends the last spans."""

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing
        self._tracer = tracing.tracer

    @classmethod
    def open(cls, settings: TraceSettings) -> RouterTracing:
        return cls(open_tracing(settings, service_name=settings.service_name))

    def begin(self, scope: dict[str, Any], route: str, request_id: str | None) -> RequestTrace:
        traceparent, tracestate = request_headers(scope, _TRACEPARENT, _TRACESTATE)
        parent = parent_context(
            traceparent.decode("latin-1") if traceparent else None,
            tracestate.decode("latin-1") if tracestate else None,
        )
        span = self._tracer.start_span(
            f"POST {route}",
            context=parent,
            kind=trace.SpanKind.SERVER,
            attributes={
                "http.request.method": "POST",
                "http.route": route,
                "url.path": scope.get("path", route),
                "sr.request_id": request_id or "",
            },
        )
        return RequestTrace(span, DispatchTrace(self._tracer, span))

    def shutdown(self) -> None:
        self.tracing.shutdown()


class RequestTrace:
    """One request's server span and the pool's spans under it (`dispatch`)."""

    __slots__ = ("dispatch", "span")

    def __init__(self, span: Any, dispatch: DispatchTrace) -> None:
        self.span = span
        self.dispatch = dispatch

    def end(self, deployment: str, outcome: str, status: int) -> None:
        span = self.span
        if deployment:
            span.set_attribute("sr.deployment", deployment)
        span.set_attribute("sr.outcome", outcome)
        if status:  # 0: the caller hung up before an answer
            span.set_attribute("http.response.status_code", status)
        if status >= 500 or outcome in ("failed", "timeout", "unavailable", "overloaded"):
            span.set_status(trace.StatusCode.ERROR, outcome)
        span.end()
