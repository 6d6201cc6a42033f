"""HTTP/1.1 request parsing for sr.http.server: llhttp (through httptools), as events in order.

llhttp is Node.js's parser, written in C; httptools is the binding uvicorn serves with. It
replaced h11 here because parsing was the largest cost left on a routed request's critical
path: 35 us per request with h11 against 4 us in isolation (docs/benchmarks.md), paid
twice per request (router and worker). It is strict by default: bare LF, obsolete line
folding, NUL or CR in values, bad chunk sizes, and Content-Length together with
Transfer-Encoding are errors, which is what stops request smuggling.

What llhttp leaves to its user is done here: a cap on the size of a request head (431),
h11's rules for keep-alive (HTTP/1.1 without `Connection: close`) and for a mandatory
`Host` on HTTP/1.1 requests, header values with surrounding whitespace removed, and
lower-case header names. Beyond llhttp's checks, a request is refused (and the connection
closed) when its version is not HTTP/1.0 or 1.1 (505), when a header sr reads as one
value is repeated (`Host`, `Authorization`, `X-Request-Timeout-Ms`: which copy wins
would be a guess), when its body framing is not one sr accepts (sr.http.framing), or when
its target is neither origin-form (`/path?query`) nor absolute-form
(`http://host/path`, RFC 9112 section 3.2.2: accepted, the authority ignored).

A chunked body is held to the body cap by what it announces, not only by what it sends:
llhttp parses each chunk-size line but httptools hands the size to nobody, so the line is
read back here from the raw bytes (`announced_chunk_size`), and a chunk that alone, or
with the chunks before it, would take the body over `max_body_bytes` is refused (413)
as soon as its size line is in, instead of waiting for bytes that would only be refused
later (or, never sent, held the connection until the body timeout).

A chunked body's trailer fields are read, counted against the head-size cap, and dropped:
they never join the header section (RFC 9110 section 6.5), which an app has already been
handed and in which a trailing `Authorization` would otherwise pass as a header. No route
of sr's reads trailers.

A protocol upgrade (`Upgrade`, CONNECT) is never switched to: the request is served as an
ordinary one and the connection closes after its answer.

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

from sr.errors import (
    HeadersTooLarge,
    InvalidRequest,
    RequestError,
    RequestTooLarge,
    VersionNotSupported,
)
from sr.http.framing import CHUNKED, request_body_length


@attrs.define(slots=True)
class RequestHead:
    method: bytes
    target: bytes
    http_version: bytes  # b"1.1" or b"1.0"
    headers: list[tuple[bytes, bytes]]  # names lower-case, in arrival order
    keep_alive: bool  # whether the caller lets the connection carry another request
    expects_continue: bool  # `Expect: 100-continue`: the body waits for a go-ahead
    raw_path: bytes  # the target's path, still percent-encoded (absolute-form: its path)
    query: bytes  # after the "?", without it
    body_length: int  # declared (0 without a body), or sr.http.framing.CHUNKED


class Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


END: Final = Marker("END")  # the current request's body is complete
NEED_DATA: Final = Marker("NEED_DATA")  # nothing parsed is waiting; read more
CLOSED: Final = Marker("CLOSED")  # the caller closed (or no further request can follow)
# Headers sr reads as a single value: a repeat is refused rather than one copy picked.
_SINGLE_VALUED = frozenset(
    {b"host", b"authorization", b"x-request-timeout-ms", b"x-request-id", b"origin"}
)
_FRAMING = frozenset({b"content-length", b"transfer-encoding"})  # read by sr.http.framing
_CHECKED = _SINGLE_VALUED | _FRAMING | {b"connection", b"expect"}
_HTTP_1_1: Final = b"1.1"
_HTTP_1_0: Final = b"1.0"
# Raw bytes kept between reads inside a chunked body, for a size line split across reads;
# a longer line (extensions) split so is not read back, and the body's bytes are capped
# as they arrive instead.
_SIZE_LINE_TAIL = 256


class RequestParser:
    """`max_body_bytes`: the cap a chunked body's announced sizes are held to (None: none)."""

    def __init__(self, max_header_bytes: int, max_body_bytes: int | None = None) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._max_header_bytes = max_header_bytes
        self._max_body_bytes = max_body_bytes
        self._events: collections.deque = collections.deque()
        self._done = False  # closed, failed or upgraded: nothing more is parsed
        self._in_message = False  # from a request's first byte to the end of its body
        self._in_head = False  # from a request's first byte to the end of its head
        self._section_bytes = 0  # of the current head (or trailer section), as parsed
        self._stalled_bytes = 0  # fed inside a message by reads that produced no event
        self._target = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._last_head: RequestHead | None = None
        # A chunked body's accounting (only while one is read, and only with a cap).
        self._chunked = False  # inside a chunked body held to the cap
        self._chunk_open = False  # between a chunk's size line and its end
        self._chunk_bytes = 0  # of the open chunk, parsed so far
        self._chunks_bytes = 0  # of this body's complete chunks
        self._size_line_in = False  # a chunk's size line was parsed by this read
        self._raw_tail = b""  # the last bytes read between chunks

    # -- feeding ----------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        """Bytes read from the caller; b"" when the caller closed its side."""
        if self._done:
            return
        if not data:
            self._done = True
            self._events.append(CLOSED)
            return
        continues_message = self._in_message
        events_before = len(self._events)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._stop(None)  # the upgraded request was queued; no switch is made
        except httptools.HttpParserCallbackError as error:
            cause = error.__cause__ or error.__context__  # what the callback raised
            self._stop(cause if isinstance(cause, RequestError) else _malformed(error))
        except httptools.HttpParserError as error:
            self._stop(_parse_error(error))
        else:
            # Bound what llhttp and httptools buffer for a head or a trailer section that
            # never ends: count the reads that continued a message without producing an
            # event (a body's bytes are events, so only heads and trailers, and chunk
            # framing, count). A read that began a request may mostly hold the one
            # before, so it does not count: at most one read more than the cap is held.
            if not (continues_message and self._in_message) or len(self._events) > events_before:
                self._stalled_bytes = 0
            else:
                self._stalled_bytes += len(data)
                if self._stalled_bytes > self._max_header_bytes:
                    self._stop(HeadersTooLarge("request head or trailers too large"))
            if self._chunked and not self._done:
                self._hold_chunks_to_the_cap(data)

    def _hold_chunks_to_the_cap(self, data: bytes) -> None:
        """After a read inside a chunked body: refuse a chunk whose size line (parsed by
        this read) announces more than the cap leaves; keep the tail of a read that ends
        between chunks, where a size line may be arriving in pieces."""
        if not self._chunk_open:
            tail = self._raw_tail + data if len(data) < _SIZE_LINE_TAIL else data
            self._raw_tail = tail[-_SIZE_LINE_TAIL:]
            return
        if self._size_line_in:
            self._size_line_in = False
            size = announced_chunk_size(self._raw_tail + data, self._chunk_bytes)
            assert self._max_body_bytes is not None  # _chunked is only set with a cap
            if size is not None and self._chunks_bytes + size > self._max_body_bytes:
                self._stop(RequestTooLarge(f"request body exceeds {self._max_body_bytes} bytes"))
        self._raw_tail = b""

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

    def take_whole_body(self) -> bytes | None:
        """The current request's body and its END, taken, when both are the next events
        (a body parsed in one piece, or none); None, with nothing taken, otherwise."""
        events = self._events
        if events and events[0] is END:
            events.popleft()
            return b""
        if len(events) > 1 and type(events[0]) is bytes and events[1] is END:
            body = events.popleft()
            events.popleft()
            return body
        return None

    def has_pending(self) -> bool:
        """Whether parsed events are waiting (for the current or a pipelined request)."""
        return bool(self._events)

    def head_begun(self) -> bool:
        """Whether bytes of a request head that is not complete yet have arrived."""
        return self._in_head

    # -- llhttp callbacks -------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._in_message = self._in_head = True
        self._section_bytes = self._stalled_bytes = 0
        self._target = b""
        self._headers = []

    def on_url(self, url: bytes) -> None:
        self._target += url
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        if self._in_head:
            self._headers.append((name.lower(), value.strip(b" \t")))
        # else a trailer field: counted, then dropped (never a header; module docstring)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._section_bytes = 0  # a trailer section is capped on its own
        version = self._parser.get_http_version()
        if version == "1.1":
            http_version, keep_alive = _HTTP_1_1, True
        elif version == "1.0":
            http_version, keep_alive = _HTTP_1_0, False
        else:
            raise VersionNotSupported(f"HTTP/{version} is not supported; use HTTP/1.1 or HTTP/1.0")
        headers = self._headers
        expects_continue = framed = False
        single_valued: list[bytes] = []
        # One pass; a header none of the checks reads costs one set lookup (this runs
        # for every request: docs/benchmarks.md, "instructions per request").
        for name, value in headers:
            if name not in _CHECKED:
                continue
            if name in _SINGLE_VALUED:
                if name in single_valued:
                    raise _malformed(f"more than one {name.decode('ascii').title()} header")
                single_valued.append(name)
            elif name in _FRAMING:
                framed = True
            elif name == b"connection":
                if b"close" in _tokens(value):
                    keep_alive = False
            elif value.lower() == b"100-continue":  # Expect
                expects_continue = http_version is _HTTP_1_1
        if http_version is _HTTP_1_1 and b"host" not in single_valued:
            raise _malformed("HTTP/1.1 needs exactly one Host header")
        body_length = 0
        if framed:
            body_length = request_body_length(http_version, headers)
            if body_length == CHUNKED and self._max_body_bytes is not None:
                self._chunked, self._chunk_open = True, False
                self._chunks_bytes = 0
                self._raw_tail = b""
        raw_path, query = split_target(self._target)
        head = RequestHead(
            self._parser.get_method(), self._target, http_version, headers, keep_alive,
            expects_continue, raw_path, query, body_length,
        )  # fmt: skip
        self._last_head = head
        self._events.append(head)

    def on_body(self, body: bytes) -> None:
        self._events.append(bytes(body))
        if self._chunk_open:
            self._chunk_bytes += len(body)

    def on_chunk_header(self) -> None:  # called by llhttp once a chunk's size line is in
        self._chunk_open = self._size_line_in = True
        self._chunk_bytes = 0

    def on_chunk_complete(self) -> None:
        self._chunk_open = False
        self._chunks_bytes += self._chunk_bytes

    def on_message_complete(self) -> None:
        self._in_message = self._chunked = False
        self._events.append(END)

    def _count(self, size: int) -> None:
        self._section_bytes += size
        if self._section_bytes > self._max_header_bytes:
            raise HeadersTooLarge("request head or trailers too large")


def announced_chunk_size(raw: bytes, chunk_bytes: int) -> int | None:
    """The size a chunk's size line announced, read back from `raw`: bytes that end with
    that line, its CRLF and the first `chunk_bytes` bytes of the chunk (llhttp has checked
    the line). None when the line does not begin within `raw`."""
    end = len(raw) - chunk_bytes - 2
    if end < 0 or raw[end : end + 2] != b"\r\n":
        return None
    start = raw.rfind(b"\n", 0, end) + 1  # after the CRLF ending the head or the last chunk
    if start == 0:
        return None
    try:
        return int(raw[start:end].split(b";", 1)[0].strip(b" \t"), 16)
    except ValueError:
        return None


def split_target(target: bytes) -> tuple[bytes, bytes]:
    """(path, query) of an origin-form (`/p?q`) or absolute-form (`http://h/p?q`) target;
    InvalidRequest for any other form (`*`, an authority alone)."""
    if target[:1] != b"/":
        scheme, sep, rest = target.partition(b"://")
        if not (sep and scheme.lower() in (b"http", b"https")):
            raise _malformed("the request target must be a path (or an absolute http URL)")
        start = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0), default=len(rest))
        target = rest[start:]
        if not target.startswith(b"/"):
            target = b"/" + target
    path, _, query = target.partition(b"?")
    return path, query


def _tokens(value: bytes) -> list[bytes]:
    return [token.strip() for token in value.lower().split(b",")]


def _malformed(why: object) -> InvalidRequest:
    return InvalidRequest(f"malformed HTTP request: {why}")


def _parse_error(error: httptools.HttpParserError) -> RequestError:
    # llhttp refuses a well-formed version it does not speak (HTTP/1.2, 3.0) as a parse
    # error; the caller is told 505 as for the versions it does parse (0.9, 2.0).
    if "HTTP version" in str(error):
        return VersionNotSupported(f"{error}; use HTTP/1.1 or HTTP/1.0")
    return _malformed(error)
