"""sr.http.asgi.read_body: every body read is capped in size and in time."""

from __future__ import annotations

import pytest
import trio

from sr.errors import BodyReadTimeout, InvalidRequest, RequestTooLarge
from sr.http.asgi import ClientDisconnected, read_body


def feeder(*messages):
    """An ASGI receive that yields `messages`, then waits for ever (a trickling client)."""
    pending = list(messages)

    async def receive():
        if pending:
            return pending.pop(0)
        await trio.sleep_forever()

    return receive


def chunk(body: bytes, more: bool) -> dict:
    return {"type": "http.request", "body": body, "more_body": more}


async def test_chunks_are_joined():
    receive = feeder(chunk(b'{"a":', True), chunk(b"1}", False))
    assert await read_body(receive, None, 100) == b'{"a":1}'


async def test_a_body_that_never_completes_times_out(autojump_clock):
    receive = feeder(chunk(b"{", True))
    started = trio.current_time()
    with pytest.raises(BodyReadTimeout, match="not complete within 30s"):
        await read_body(receive, None, 100)
    assert trio.current_time() - started == pytest.approx(30.0)


async def test_size_cap_from_header_and_while_reading():
    with pytest.raises(RequestTooLarge):
        await read_body(feeder(), b"101", 100)
    with pytest.raises(RequestTooLarge):
        await read_body(feeder(chunk(b"x" * 60, True), chunk(b"x" * 60, False)), None, 100)
    with pytest.raises(InvalidRequest, match="Content-Length"):
        await read_body(feeder(), b"ten", 100)


async def test_disconnect_mid_body():
    with pytest.raises(ClientDisconnected):
        await read_body(feeder(chunk(b"{", True), {"type": "http.disconnect"}), None, 100)
