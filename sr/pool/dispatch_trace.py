"""The spans of one request's way through a deployment's pool, when traces are on.

The router makes one `DispatchTrace` per traced request (sr.router.tracing), under its
server span, and hands it to `Supervisor.request_raw`; the pool calls it at each step:

    dispatch            the deployment's whole dispatch: its attempts and their retry
      admission         the replica chosen (or the refusal: overloaded, unavailable)
      hop               one attempt's exchange with the replica (a client span), whose
                        context travels to the worker as W3C `traceparent`

Only a traced request builds one: with traces off the pool's path checks for None and
nothing else (this module, and the OpenTelemetry API it imports, are not even loaded).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from opentelemetry import trace

from sr.traces import traceparent_of

Admission = TypeVar("Admission")


class Hop:
    """One attempt's client span and the `traceparent` it sends."""

    __slots__ = ("span", "traceparent")

    def __init__(self, span: Any) -> None:
        self.span = span
        self.traceparent = traceparent_of(span)

    def answered(self, status: int, outcome: str) -> None:
        self.span.set_attribute("http.response.status_code", status)
        self.span.set_attribute("sr.outcome", outcome)
        if status >= 500:
            self.span.set_status(trace.StatusCode.ERROR)

    def failed(self, error: BaseException, outcome: str) -> None:
        self.span.set_attribute("sr.outcome", outcome)
        self.span.set_attribute("error.type", type(error).__name__)
        self.span.set_status(trace.StatusCode.ERROR, str(error))

    def end(self) -> None:
        self.span.end()


class DispatchTrace:
    """The pool's spans of one request, children of the router's server span."""

    __slots__ = ("_attempts", "_dispatch", "_parent", "_tracer")

    def __init__(self, tracer: Any, parent_span: Any) -> None:
        self._tracer = tracer
        self._parent = trace.set_span_in_context(parent_span)
        self._dispatch: Any = None
        self._attempts = 0

    @contextlib.contextmanager
    def dispatching(self, deployment: str) -> Iterator[None]:
        """The `dispatch` span around a deployment's attempts; an error escaping it is
        recorded on it."""
        self._dispatch = self._tracer.start_span(
            "dispatch", context=self._parent, attributes={"sr.deployment": deployment}
        )
        try:
            yield
        except BaseException as error:
            self._dispatch.set_attribute("error.type", type(error).__name__)
            self._dispatch.set_status(trace.StatusCode.ERROR, str(error))
            raise
        finally:
            self._dispatch.set_attribute("sr.attempts", self._attempts)
            self._dispatch.end()

    def retrying(self, first: BaseException) -> None:
        """The first replica gave no answer; the request is tried once on another."""
        if self._dispatch is not None:
            self._dispatch.add_event("retry", {"sr.reason": str(first)})

    def admit(self, reserve: Callable[[], Admission]) -> Admission:
        """`reserve()` (the pool's choice of a replica) inside the `admission` span, which
        names the replica chosen, or the refusal."""
        context = trace.set_span_in_context(self._dispatch) if self._dispatch else self._parent
        self._attempts += 1
        span = self._tracer.start_span(
            "admission", context=context, attributes={"sr.attempt": self._attempts}
        )
        try:
            admitted = reserve()
        except BaseException as error:
            span.set_attribute("error.type", type(error).__name__)
            span.set_status(trace.StatusCode.ERROR, str(error))
            raise
        else:
            replica = getattr(getattr(admitted, "record", None), "id", None)
            if replica is not None:
                span.set_attribute("sr.replica", str(replica))
        finally:
            span.end()
        return admitted

    def hop(self, replica: str, path: str) -> Hop:
        """The client span of one exchange with `replica`: started now, ended by the pool."""
        context = trace.set_span_in_context(self._dispatch) if self._dispatch else self._parent
        span = self._tracer.start_span(
            "hop",
            context=context,
            kind=trace.SpanKind.CLIENT,
            attributes={
                "http.request.method": "POST",
                "url.path": path,
                "sr.replica": replica,
                "sr.attempt": self._attempts,
                "sr.retry": self._attempts > 1,
            },
        )
        return Hop(span)
