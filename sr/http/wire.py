"""The bytes sr's HTTP/1.1 server writes: answer heads and `100 Continue`.

Answers are written here rather than through h11's state machine: sr writes only answers
of its own making, each complete in one piece with a Content-Length, so the general
machinery (event objects, header normalisation, framing choice) bought nothing, and it was
the largest single cost left on the router's answer path (docs/benchmarks.md: about 20 us
of 48 per request cycle in isolation, 70 us in the router).
What h11 checked on the way out is checked here: the status is three digits, header names
are tokens, header values carry no CR, LF or NUL (no header injection), and the server
alone frames the answer (Content-Length, Connection; which answers have a length is
sr.http.framing's). Every answer carries a `Date` (RFC 9110 section 6.6.1: an origin server
with a clock MUST send it), formatted once a second.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from email.utils import formatdate
from http import HTTPStatus

REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_STATUS_LINES = {code: b"HTTP/1.1 %d %s\r\n" % (code, reason) for code, reason in REASONS.items()}
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Framing and the date are the server's: it declares the length of every answer, decides
# whether the connection stays open, and dates it. An app's own copies are dropped.
_SERVER_OWNED = frozenset({b"content-length", b"transfer-encoding", b"connection", b"date"})
# Header names already written, known to be tokens and not the server's: apps write a few
# constant names, so each is matched once, not once per answer. Bounded, for an app that
# makes names up.
_WRITABLE_NAMES: set[bytes] = set()
_WRITABLE_NAMES_MAX = 256
_date_second = -1
_date_line = b""


def _current_date_line() -> bytes:
    """`date: <now>\r\n`, formatted at most once a second."""
    global _date_second, _date_line
    now = int(time.time())
    if now != _date_second:
        _date_line = b"date: %s\r\n" % formatdate(now, usegmt=True).encode("ascii")
        _date_second = now
    return _date_line


class InvalidAnswer(Exception):
    """An answer that cannot be written as given: a bug in the handler or app."""


def answer_head(
    status: int, headers: Iterable[tuple[bytes, bytes]], length: int | None, *, close: bool
) -> bytes:
    """Status line and headers of an answer whose body is `length` bytes (None: an answer
    without a Content-Length, such as 204), ending in the blank line. InvalidAnswer for a
    status outside 100-999 or a header that is not bytes, has a name that is not a token,
    or a value with CR, LF or NUL."""
    if not (isinstance(status, int) and 100 <= status <= 999):
        raise InvalidAnswer(f"status {status!r} is not a three-digit code")
    parts = [_STATUS_LINES.get(status) or b"HTTP/1.1 %d \r\n" % status]
    try:
        for name, value in headers:
            if name not in _WRITABLE_NAMES:
                if name.lower() in _SERVER_OWNED:
                    continue
                if not _TOKEN.fullmatch(name):
                    raise InvalidAnswer(f"header {name[:40]!r} cannot be written")
                if len(_WRITABLE_NAMES) < _WRITABLE_NAMES_MAX:
                    _WRITABLE_NAMES.add(bytes(name))
            if b"\r" in value or b"\n" in value or b"\0" in value:
                raise InvalidAnswer(f"header {name[:40]!r} cannot be written")
            parts += (name, b": ", value, b"\r\n")
    except (TypeError, ValueError) as error:  # not (bytes, bytes) pairs
        raise InvalidAnswer(f"headers must be (bytes, bytes) pairs: {error}") from None
    parts.append(_current_date_line())
    if length is not None:
        parts.append(b"content-length: %d\r\n" % length)
    if close:
        parts.append(b"connection: close\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)
