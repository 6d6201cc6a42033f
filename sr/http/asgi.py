"""Small ASGI helpers for the router's front end.

The front end is a plain ASGI callable (no framework), served by sr's own HTTP/1.1 server
(sr.http.server through sr.http.asgi_adapter) to keep the per-request hop lean. Every body read is
capped in size and in time: a client that trickles its body cannot hold a connection and a
task for ever.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from sr.answer import Answer
from sr.errors import InvalidRequest, RequestError
from sr.http import body as body_reader
from sr.http.body import ClientDisconnected
from sr.http.limits import BODY_TIMEOUT_S, MAX_BODY_BYTES

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

DEFAULT_MAX_BODY_BYTES = MAX_BODY_BYTES
BODY_READ_TIMEOUT_S = BODY_TIMEOUT_S

__all__ = ["ClientDisconnected", "read_body", "request_headers", "send_error", "send_json"]


def request_headers(scope: dict[str, Any], *names: bytes) -> list[bytes | None]:
    """Values of the wanted (lower-case) headers, in the order asked; None if absent."""
    wanted = {name: i for i, name in enumerate(names)}
    found: list[bytes | None] = [None] * len(names)
    for name, value in scope["headers"]:
        index = wanted.get(name)
        if index is not None:
            found[index] = value
    return found


async def read_body(
    receive: Receive,
    content_length: bytes | None,
    max_bytes: int,
    timeout_s: float = BODY_READ_TIMEOUT_S,
    extensions: dict | None = None,
) -> bytes:
    """The whole request body, through sr.http.body (the one body reader). RequestTooLarge
    as soon as it is known to exceed max_bytes, BodyReadTimeout if it is not complete within
    timeout_s, ClientDisconnected if the caller went away. `extensions`: the scope's, for
    the server's COMPLETE_BODY_EXTENSION where it offers one."""
    declared = None
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError:
            raise InvalidRequest("Content-Length header is not an integer") from None
    complete = extensions.get(body_reader.COMPLETE_BODY_EXTENSION) if extensions else None
    take = complete["take"] if complete else None
    return await body_reader.read_body(receive, declared, max_bytes, timeout_s, take)


async def serve_lifespan(receive: Receive, send: Send) -> None:
    """Answer ASGI lifespan messages; nothing to set up or tear down."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def send_response(
    send: Send,
    status: int,
    body: bytes,
    headers: Iterable[tuple[bytes, bytes]] = (),
    content_type: bytes = b"application/json",
) -> None:
    """One answer with its length declared: without Content-Length the body would be framed
    as chunked: more bytes on the wire and more work per answer."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, payload: Any) -> None:
    await send_response(send, status, json.dumps(payload, separators=(",", ":")).encode())


async def send_answer(send: Send, answer: Answer) -> None:
    """An answer whole (sr.answer) as the two ASGI messages, its length declared."""
    status, head, body = answer
    length = (b"content-length", str(len(body)).encode())
    await send({"type": "http.response.start", "status": status, "headers": [*head, length]})
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, error: RequestError) -> None:
    """The error's one answer, `error.answer()` (sr.errors)."""
    await send_answer(send, error.answer())
