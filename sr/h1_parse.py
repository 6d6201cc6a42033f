"""HTTP/1.1 request parsing for sr.h1_server: llhttp (through httptools), as events in order.

llhttp is Node.js's parser, written in C; httptools is the binding uvicorn serves with. It
replaced h11 here because parsing was the largest cost left on a routed request's critical
path: 35 us per request with h11 against 4 us in isolation (docs/benchmarks.md), paid
twice per request (router and worker). It is strict by default: bare LF, obsolete line
folding, NUL or CR in values, bad chunk sizes, and Content-Length together with
Transfer-Encoding are errors, which is what stops request smuggling.

What llhttp leaves to its user is done here: a cap on the size of a request head (431),
h11's rules for keep-alive (HTTP/1.1 without `Connection: close`) and for a mandatory
`Host` on HTTP/1.1 requests, header values with surrounding whitespace removed, and
lower-case header names. A protocol upgrade (`Upgrade`, CONNECT) is never switched to: the
request is served as an ordinary one and the connection closes after its answer.

`RequestParser.feed()` turns bytes into events, in arrival order, possibly for several
pipelined requests: a `RequestHead`, body chunks (`bytes`), then `END`; a request that
cannot be parsed becomes an error raised by `next_event()` once the events before it are
consumed. Nothing is lost or reordered, and the server reads more only when the queue is
empty, so what waits here is bounded by one read.
"""

from __future__ import annotations

import collections
from typing import Final

import attrs
import httptools

from sr.errors import InvalidRequest, RequestError


class HeadersTooLarge(RequestError):
    status, code = 431, "request_header_fields_too_large"


@attrs.define(slots=True)
class RequestHead:
    method: bytes
    target: bytes
    http_version: bytes  # b"1.1" or b"1.0"
    headers: list[tuple[bytes, bytes]]  # names lower-case, in arrival order
    keep_alive: bool  # whether the caller lets the connection carry another request
    expects_continue: bool  # `Expect: 100-continue`: the body waits for a go-ahead


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


END: Final = _Marker("END")  # the current request's body is complete
NEED_DATA: Final = _Marker("NEED_DATA")  # nothing parsed is waiting; read more
CLOSED: Final = _Marker("CLOSED")  # the caller closed (or no further request can follow)


class RequestParser:
    def __init__(self, max_header_bytes: int) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._max_header_bytes = max_header_bytes
        self._events: collections.deque = collections.deque()
        self._done = False  # closed, failed or upgraded: nothing more is parsed
        self._in_head = False
        self._head_bytes = 0  # of the current head, as parsed (target and header lines)
        self._head_raw = 0  # bytes fed while the current head stayed incomplete
        self._target = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._last_head: RequestHead | None = None

    # -- feeding ----------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        """Bytes read from the caller; b"" when the caller closed its side."""
        if self._done:
            return
        if not data:
            self._done = True
            self._events.append(CLOSED)
            return
        continues_head = self._in_head
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._stop(None)  # the upgraded request was queued; no switch is made
        except httptools.HttpParserCallbackError as error:
            cause = error.__cause__ or error.__context__  # what the callback raised
            self._stop(cause if isinstance(cause, RequestError) else _malformed(error))
        except httptools.HttpParserError as error:
            self._stop(_malformed(error))
        else:
            # A head still incomplete: bound what llhttp buffers for it. Only reads that
            # began inside the head count (one that began it may mostly hold the request
            # before), so at most one read more than the cap is ever buffered.
            if continues_head and self._in_head:
                self._head_raw += len(data)
                if self._head_raw > self._max_header_bytes:
                    self._stop(HeadersTooLarge("request headers too large"))

    def _stop(self, error: RequestError | None) -> None:
        self._done = True
        if error is not None:
            self._events.append(error)
        elif self._last_head is not None:  # upgraded: no request can follow this one
            self._last_head.keep_alive = False
        self._events.append(CLOSED)

    # -- consuming --------------------------------------------------------------------
    def next_event(self):
        """The next event, NEED_DATA, or CLOSED; raises the RequestError of a request that
        cannot be parsed (InvalidRequest 400, HeadersTooLarge 431)."""
        if not self._events:
            return NEED_DATA
        event = self._events[0]
        if event is CLOSED:
            return CLOSED  # stays: every later call sees it too
        self._events.popleft()
        if isinstance(event, RequestError):
            self._events.clear()
            self._events.append(CLOSED)
            raise event
        return event

    def has_pending(self) -> bool:
        """Whether parsed events are waiting (for the current or a pipelined request)."""
        return bool(self._events)

    # -- llhttp callbacks -------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._in_head = True
        self._head_bytes = self._head_raw = 0
        self._target = b""
        self._headers = []

    def on_url(self, url: bytes) -> None:
        self._target += url
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        self._headers.append((name.lower(), value.strip(b" \t")))

    def on_headers_complete(self) -> None:
        self._in_head = False
        version = self._parser.get_http_version().encode("ascii")
        headers = self._headers
        keep_alive = version == b"1.1"
        expects_continue = False
        hosts = 0
        for name, value in headers:
            if name == b"connection" and b"close" in _tokens(value):
                keep_alive = False
            elif name == b"expect" and value.lower() == b"100-continue":
                expects_continue = version == b"1.1"
            elif name == b"host":
                hosts += 1
        if version == b"1.1" and hosts != 1:
            raise InvalidRequest("malformed HTTP request: HTTP/1.1 needs exactly one Host header")
        method = self._parser.get_method()
        head = RequestHead(method, self._target, version, headers, keep_alive, expects_continue)
        self._last_head = head
        self._events.append(head)

    def on_body(self, body: bytes) -> None:
        self._events.append(bytes(body))

    def on_message_complete(self) -> None:
        self._events.append(END)

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self._max_header_bytes:
            raise HeadersTooLarge("request headers too large")


def _tokens(value: bytes) -> list[bytes]:
    return [token.strip() for token in value.lower().split(b",")]


def _malformed(error: Exception) -> InvalidRequest:
    return InvalidRequest(f"malformed HTTP request: {error}")
