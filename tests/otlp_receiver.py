"""An OTLP/HTTP trace receiver on loopback for tests: it decodes each export with
`opentelemetry-proto` (the collector's own message types), or, hung, never answers.

`spans()` gives every span received so far as `ReceivedSpan` (ids as hex, attributes as
plain values, the resource's `service.name`).
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@attrs.frozen
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int  # opentelemetry.proto.trace.v1.Span.SpanKind: 2 server, 3 client
    service: str
    attributes: dict[str, Any]
    start_ns: int
    end_ns: int


def _value(any_value: Any) -> Any:
    field = any_value.WhichOneof("value")
    return getattr(any_value, field) if field else None


def decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest.FromString(body)
    found = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                found.append(
                    ReceivedSpan(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        kind=span.kind,
                        service=str(resource.get("service.name")),
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                    )
                )
    return found


class OtlpReceiver:
    """`with OtlpReceiver(hang=False) as receiver:` serves `receiver.url` until the end."""

    def __init__(self, *, hang: bool = False) -> None:
        self.hang = hang
        self.exports_seen = 0  # export requests that arrived (answered or hung)
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self._release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                with receiver._lock:
                    receiver.exports_seen += 1
                if receiver.hang:
                    receiver._release.wait(60)  # a collector that takes, then hangs
                    return
                spans = decode(body) if self.path == "/v1/traces" else []
                with receiver._lock:
                    receiver._spans.extend(spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def wait_for(self, check, timeout_s: float) -> list[ReceivedSpan]:
        """The spans once `check(spans)` holds; AssertionError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            spans = self.spans()
            if check(spans):
                return spans
            time.sleep(0.05)
        raise AssertionError(f"spans not complete in {timeout_s}s: {self.spans()!r}")
