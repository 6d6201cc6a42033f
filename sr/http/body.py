"""Reading a whole request body, capped in size and in time: the one body reader of the HTTP
stack. The worker's handler path (sr.http.driver) and the router's ASGI app
(sr.http.asgi.read_body) both read through it, each with the cap and timeout of its
`HttpLimits` (sr.http.limits): RequestTooLarge (413) as soon as the declared length or the
bytes read exceed the cap, BodyReadTimeout (408) when the body is not complete in time.

The hop client's answers (sr.http.client) are not read here: an answer's length is always
declared and checked against the client's cap before it is read, and its time is bounded by
the dispatch's cancel scope, so that read is "exactly N bytes", with nothing to cap.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from sr.errors import BodyReadTimeout, RequestTooLarge

# The body's pieces come as ASGI `http.request` messages ({"body": ..., "more_body": ...};
# `http.disconnect` when the caller left): the router's app reads its ASGI `receive` as is,
# and the worker's handler path (sr.http.driver) hands its parser's chunks over in the same
# shape, so neither pays for a translation layer on every request.
Receive = Callable[[], Awaitable[dict[str, Any]]]


# An ASGI extension sr's server offers (sr.http.asgi_adapter): `["take"]()` is the whole
# request body when it is already here, taken without waiting (the usual case: a small
# body comes with its head), else None, and the body is then read through `receive`. An
# app that takes it spares the body timeout's cancel scope on most requests.
COMPLETE_BODY_EXTENSION = "sr.complete_body"


class ClientDisconnected(Exception):
    """The caller closed the connection before its request body was complete."""


async def read_body(
    receive: Receive,
    declared: int | None,
    max_bytes: int,
    timeout_s: float,
    take_complete: Callable[[], bytes | None] | None = None,
) -> bytes:
    """The whole body from `receive()`; `declared` is its announced length, if any.
    `timeout_s` of 0 or less: no timeout. `take_complete`: the server's
    COMPLETE_BODY_EXTENSION, tried first."""
    if declared is not None and declared > max_bytes:
        raise RequestTooLarge(f"request body exceeds {max_bytes} bytes")
    if take_complete is not None:
        whole = take_complete()
        if whole is not None:
            if len(whole) > max_bytes:
                raise RequestTooLarge(f"request body exceeds {max_bytes} bytes")
            return whole
    chunks: list[bytes] = []
    size = 0
    with trio.move_on_after(timeout_s if timeout_s > 0 else math.inf):
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnected()
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > max_bytes:
                    raise RequestTooLarge(f"request body exceeds {max_bytes} bytes")
                chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    raise BodyReadTimeout(f"request body not complete within {timeout_s:g}s")
