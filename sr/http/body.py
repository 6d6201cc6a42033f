"""Reading a whole request body, capped in size and in time: the one body reader of the HTTP
stack. The worker's handler path (sr.http.server) and the router's ASGI app
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

import trio

from sr.errors import BodyReadTimeout, RequestTooLarge

# One piece of a body and whether more follows (b"", False: the body is complete).
NextChunk = Callable[[], Awaitable[tuple[bytes, bool]]]


async def read_body(
    next_chunk: NextChunk, declared: int | None, max_bytes: int, timeout_s: float
) -> bytes:
    """The whole body from `next_chunk()`; `declared` is its announced length, if any.
    `timeout_s` of 0 or less: no timeout."""
    if declared is not None and declared > max_bytes:
        raise RequestTooLarge(f"request body exceeds {max_bytes} bytes")
    chunks: list[bytes] = []
    size = 0
    with trio.move_on_after(timeout_s if timeout_s > 0 else math.inf):
        while True:
            chunk, more = await next_chunk()
            if chunk:
                size += len(chunk)
                if size > max_bytes:
                    raise RequestTooLarge(f"request body exceeds {max_bytes} bytes")
                chunks.append(chunk)
            if not more:
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    raise BodyReadTimeout(f"request body not complete within {timeout_s:g}s")
