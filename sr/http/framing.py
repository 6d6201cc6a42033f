"""How a message's body is framed on the wire (RFC 9112 section 6), decided in one place
for requests and answers, router and worker alike.

Requests: llhttp does the reading, but which framings sr accepts is decided here, from
the head alone, before any app sees the request. Only a Content-Length or
`Transfer-Encoding: chunked` (alone, on HTTP/1.1) frames a body: a request whose length a
proxy in front could read differently (both headers, another coding, a coding list, a
Transfer-Encoding on HTTP/1.0) is refused with 400 and the connection closes, so no
request can be smuggled behind it.

Answers: 1xx, 204 and 304 have neither a body nor a Content-Length (RFC 9110 sections
8.6, 15.2, 15.3.5, 15.4.5); an answer to HEAD declares the length a GET would get and
sends no body; everything else declares its length and sends its body.
"""

from __future__ import annotations

from collections.abc import Iterable

from sr.errors import InvalidRequest

CHUNKED = -1  # request_body_length: the body is chunked, its length unknown up front


def request_body_length(http_version: bytes, headers: Iterable[tuple[bytes, bytes]]) -> int:
    """The declared body length (0 without one), or CHUNKED; InvalidRequest for a framing
    sr does not accept. Header names are lower-case."""
    lengths: list[bytes] = []
    codings: list[bytes] = []
    for name, value in headers:
        if name == b"content-length":
            lengths.append(value)
        elif name == b"transfer-encoding":
            codings.extend(c.strip().lower() for c in value.split(b","))
    if codings:
        if lengths:
            raise _malformed("both Content-Length and Transfer-Encoding")
        if http_version != b"1.1":
            raise _malformed("Transfer-Encoding on an HTTP/1.0 request")
        if codings != [b"chunked"]:
            shown = b", ".join(codings).decode("latin-1")[:60]
            raise _malformed(f"Transfer-Encoding {shown!r} (only 'chunked' is accepted)")
        return CHUNKED
    if not lengths:
        return 0
    if len(lengths) > 1:
        raise _malformed("more than one Content-Length")
    if not lengths[0].isdigit():
        raise _malformed("Content-Length is not a non-negative integer")
    return int(lengths[0])


def answer_framing(method: bytes, status: int) -> tuple[bool, bool]:
    """(declare a Content-Length, send the body) for an answer with `status` to `method`."""
    if status < 200 or status == 204 or status == 304:
        return False, False
    if method == b"HEAD":
        return True, False
    return True, True


def _malformed(why: str) -> InvalidRequest:
    return InvalidRequest(f"malformed HTTP request: {why}")
