"""Drive an ASGI app in-process: one request, the whole answer, no sockets."""

from __future__ import annotations

import json
from typing import Any

import attrs
import trio


@attrs.define
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    raw_headers: list[tuple[str, str]] = attrs.Factory(list)  # every header, repeats included

    def all(self, name: str) -> list[str]:
        """Every value of header `name` (lower-case), in order."""
        return [value for key, value in self.raw_headers if key == name]

    def json(self) -> Any:
        return json.loads(self.body)


async def call(
    app,
    method: str,
    path: str,
    body: bytes | dict | None = None,
    headers: dict[str, str] | None = None,
    chunks: int = 1,
    disconnect_after_body: trio.Event | None = None,
    *,
    extensions: dict[str, Any] | None = None,
) -> Answer | None:
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    body = body or b""
    raw_headers = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    path, _, query = path.partition("?")
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "query_string": query.encode(),
        "headers": raw_headers,
    }
    if extensions is not None:
        scope["extensions"] = extensions
    size = max(1, len(body) // chunks) if body else 1
    pieces = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    messages = [
        {"type": "http.request", "body": piece, "more_body": i < len(pieces) - 1}
        for i, piece in enumerate(pieces)
    ]
    sent: list[dict[str, Any]] = []

    async def receive():
        if messages:
            return messages.pop(0)
        if disconnect_after_body is not None:
            await disconnect_after_body.wait()
        else:
            await trio.sleep_forever()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    if not sent:
        return None
    start = sent[0]
    raw = [(k.decode(), v.decode()) for k, v in start["headers"]]
    body_out = b"".join(m.get("body", b"") for m in sent[1:])
    return Answer(start["status"], dict(raw), body_out, raw)
