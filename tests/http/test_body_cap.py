"""A body announced over the cap is refused at once (413), not held until the body timeout:
the parser reads back each chunk's size line (sr.http.parse.announced_chunk_size), and the
server answers on the worker's handler path and the router's ASGI path alike."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager

import pytest
import trio

from sr.errors import RequestTooLarge
from sr.http.asgi import ClientDisconnected, read_body, request_headers, send_error, send_json
from sr.http.asgi_adapter import AsgiAdapter
from sr.http.limits import HttpLimits
from sr.http.parse import END, NEED_DATA, RequestParser, announced_chunk_size
from sr.http.server import H1Server, open_listeners

CAP = 1000
CHUNKED = b"POST /x HTTP/1.1\r\nHost: w\r\nTransfer-Encoding: chunked\r\n\r\n"


# -- the size line, read back ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "chunk_bytes", "size"),
    [
        (b"...\r\n\r\n3e9\r\nab", 2, 0x3E9),
        (b"xyz\r\n10;name=value\r\n", 0, 0x10),
        (b"\r\nFFFF\r\n" + b"\n" * 5, 5, 0xFFFF),  # the chunk's own bytes may hold LFs
        (b"3e9\r\nab", 2, None),  # the line's beginning is not here
        (b"\r\n3e9\r", 0, None),  # no CRLF where the chunk's bytes begin
    ],
)
def test_announced_chunk_size_reads_the_line_before_the_chunk(raw, chunk_bytes, size):
    assert announced_chunk_size(raw, chunk_bytes) == size


def _events(parser: RequestParser) -> list:
    out = []
    while (event := parser.next_event()) is not NEED_DATA:
        out.append(event)
        if event is END:
            break
    return out


def _feed(*pieces: bytes, cap: int | None = CAP) -> list:
    parser = RequestParser(16384, cap)
    out = []
    for piece in pieces:
        parser.feed(piece)
        out += _events(parser)
    return out


@pytest.mark.parametrize(
    "pieces",
    [
        [CHUNKED + b"%x\r\nabc" % (CAP + 1)],  # one chunk over the cap
        [CHUNKED, b"3", b"e", b"9", b"\r", b"\n", b"a"],  # its size line trickled
        [CHUNKED + b"%x;ext=1\r\n" % (CAP + 1)],  # with an extension, no byte of it yet
        [CHUNKED + b"258\r\n" + b"a" * 600 + b"\r\n", b"258\r\nb"],  # 600 + 600 > 1000
        [CHUNKED + b"258\r\n" + b"a" * 300, b"a" * 300 + b"\r\n258\r\nb"],
    ],
    ids=["one chunk", "trickled", "extension", "running total", "total across reads"],
)
def test_a_chunk_announced_over_the_cap_is_refused_when_its_size_line_is_in(pieces):
    with pytest.raises(RequestTooLarge):
        _feed(*pieces)


def test_chunks_within_the_cap_and_a_parser_without_one_are_read_as_before():
    body = b"1f4\r\n" + b"a" * 500 + b"\r\n1f4\r\n" + b"b" * 500 + b"\r\n0\r\n\r\n"
    events = _feed(CHUNKED + body[:200], body[200:])
    assert b"".join(e for e in events if type(e) is bytes) == b"a" * 500 + b"b" * 500
    assert events[-1] is END
    uncapped = _feed(CHUNKED + b"%x\r\nabc" % (CAP * 10), cap=None)
    assert uncapped[1:] == [b"abc"]


# -- over sockets: the worker's handler path and the router's ASGI path ---------------------
async def handler(method, path, body, headers):
    return 200, [], json.dumps({"got": len(body)}).encode()


async def app(scope, receive, send):
    """An app like the router's: reads its body through sr.http.asgi.read_body."""
    if scope["type"] != "http":
        return
    (length,) = request_headers(scope, b"content-length")
    try:
        body = await read_body(receive, length, CAP, timeout_s=10)
    except RequestTooLarge as error:
        await send_error(send, error)
        return
    except ClientDisconnected:
        return
    await send_json(send, 200, {"got": len(body)})


@asynccontextmanager
async def serving(side: str):
    limits = HttpLimits(max_body_bytes=CAP, body_timeout_s=10)
    if side == "worker":
        server = H1Server(handler, limits)
    else:
        server = H1Server(adapter=AsgiAdapter(app), limits=limits)
    listeners, _ = await open_listeners(host="127.0.0.1", port=0)
    port = listeners[0].socket.getsockname()[1]
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: server.serve(
            listeners, shutdown_trigger=stop.wait, task_status=task_status))  # fmt: skip
        yield port
        stop.set()


async def first_status(port: int, raw: bytes) -> tuple[int, float]:
    """The status of the first answer to `raw`, and how long it took (at most 3 s)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    started = trio.current_time()
    received = b""
    with trio.move_on_after(3):
        await stream.send_all(raw)
        while b"\r\n" not in received and (data := await stream.receive_some(65536)):
            received += data
    await stream.aclose()
    return (int(received[9:12]) if received else 0), trio.current_time() - started


OVER = {
    "content-length": b"POST /x HTTP/1.1\r\nHost: w\r\nContent-Length: %d\r\n\r\nab" % (CAP + 1),
    "one chunk": CHUNKED + b"%x\r\nabc" % (CAP + 1),
    "running total": CHUNKED + b"258\r\n" + b"a" * 600 + b"\r\n258\r\nb",
}


@pytest.mark.parametrize("side", ["worker", "router"])
@pytest.mark.parametrize("raw", OVER.values(), ids=OVER.keys())
async def test_a_body_announced_over_the_cap_is_413_at_once(side, raw):
    async with serving(side) as port:
        status, elapsed = await first_status(port, raw)
    assert (status, elapsed < 1.0) == (413, True), elapsed


@pytest.mark.parametrize("side", ["worker", "router"])
async def test_a_chunked_body_within_the_cap_is_served(side):
    body = b"1f4\r\n" + b"a" * 500 + b"\r\n1f4\r\n" + b"b" * 500 + b"\r\n0\r\n\r\n"
    async with serving(side) as port:
        status, _ = await first_status(port, CHUNKED + body)
    assert status == 200
