"""The front door's rules for hostile and malformed requests, as tables, against both ways
sr serves HTTP: the worker's plain handler and the router's ASGI app (RouterApp with an API
key), each over real loopback sockets. Every row is answered the same way on both sides."""

from __future__ import annotations

import json
import select
import socket
from contextlib import asynccontextmanager

import h11
import pytest
import trio

from sr.http.asgi_adapter import AsgiAdapter
from sr.http.limits import HttpLimits
from sr.http.server import H1Server

from .serving import serving
from .test_app import build

KEY = b"Authorization: Bearer k1\r\n"
EMBED = json.dumps({"model": "primary", "input": "a"}).encode()
SIDES = ["worker", "router"]


class Worker:
    """A handler like the worker's: echoes the path and body; `/slow` waits until
    cancelled (noted in `cancelled`); `/status/N` answers status N with a small body."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, bytes]] = []
        self.cancelled: list[str] = []
        self.started = trio.Event()

    async def __call__(self, method: str, path: str, body: bytes, headers=()):
        self.calls.append((method, path, body))
        if path == "/slow":
            self.started.set()
            try:
                await trio.sleep_forever()
            except trio.Cancelled:
                self.cancelled.append(path)
                raise
        if path.startswith("/status/"):
            return int(path.rsplit("/", 1)[1]), [], b"body"
        if path == "/big":
            return 200, [], b"x" * (16 << 20)
        return 200, [], json.dumps({"path": path, "body": body.decode()}).encode()


@asynccontextmanager
async def served(side: str, **limits):
    """(port, server, worker handler or None) for one side, stopped on exit."""
    worker = Worker() if side == "worker" else None
    if worker is not None:
        server = H1Server(worker, HttpLimits(**limits))
    else:
        app, _ = build(api_keys=["k1"], max_body=4096)
        server = H1Server(adapter=AsgiAdapter(app), limits=HttpLimits(**limits))
    async with serving(server) as (port, _):
        yield port, server, worker


def target(side: str) -> bytes:
    return b"/v1/embeddings" if side == "router" else b"/echo"


async def exchange(port: int, raw: bytes, *, half_close: bool = False, timeout_s: float = 5.0):
    """Send `raw`; return (answers as (status, headers, body), closed by the server)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(raw)
    if half_close:
        stream.socket.shutdown(socket.SHUT_WR)
    received = b""
    with trio.fail_after(timeout_s):
        try:
            while data := await stream.receive_some(65536):
                received += data
        except trio.BrokenResourceError:
            pass  # a reset after the answer is a close too
    await stream.aclose()
    return parse_answers(received), True


def parse_answers(received: bytes) -> list[tuple[int, dict[bytes, bytes], bytes]]:
    """Every answer in `received`, parsed by h11 (an independent parser)."""
    answers = []
    client = h11.Connection(h11.CLIENT)
    client.receive_data(received)
    client.receive_data(b"")
    while True:
        client.send(h11.Request(method="POST", target="/", headers=[("host", "x")]))
        client.send(h11.EndOfMessage())
        status, headers, body = 0, {}, b""
        while True:
            try:
                event = client.next_event()
            except h11.RemoteProtocolError:  # closed before (another) answer began
                return answers
            if isinstance(event, h11.Response):
                status, headers = event.status_code, dict(event.headers)
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                answers.append((status, headers, body))
                break
            else:  # ConnectionClosed or NEED_DATA: nothing more
                return answers
        if client.our_state is not h11.DONE or client.their_state is not h11.DONE:
            return answers
        client.start_next_cycle()


def chunked(side: str, body_lines: bytes, extra: bytes = b"") -> bytes:
    return (
        b"POST "
        + target(side)
        + b" HTTP/1.1\r\nHost: localhost\r\n"
        + KEY
        + extra
        + b"\r\n"
        + body_lines
    )


# -- malformed framing: 400 and close ----------------------------------------------------------
FRAMING = {
    "chunk size zz": b"Transfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
    "chunk size overflow": b"Transfer-Encoding: chunked\r\n\r\nffffffffffffffffffff\r\nab\r\n",
    "negative chunk size": b"Transfer-Encoding: chunked\r\n\r\n-22\r\nab\r\n0\r\n\r\n",
    "size smaller than the data": b"Transfer-Encoding: chunked\r\n\r\n2\r\nabcdef\r\n0\r\n\r\n",
    "identity without a length": b"Transfer-Encoding: identity\r\n\r\nabc",
    "xchunked": b"Transfer-Encoding: xchunked\r\n\r\nabc",
    "a coding before chunked": b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    "length and chunked": b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "two lengths": b"Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
}


@pytest.mark.parametrize("side", SIDES)
async def test_transfer_encoding_on_http_1_0_is_refused(side):
    async with served(side) as (port, _, _):
        raw = b"POST " + target(side) + b" HTTP/1.0\r\n" + KEY
        answers, _ = await exchange(port, raw + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    assert [a[0] for a in answers] == [400]


# -- versions: 505 (item 5) ---------------------------------------------------------------
VERSIONS = {
    "HTTP/2.0": b"GET /health HTTP/2.0\r\nHost: localhost\r\n\r\n",
    "HTTP/0.9 style": b"GET /health\r\n\r\n",
    "HTTP/1.2": b"GET /health HTTP/1.2\r\nHost: localhost\r\n\r\n",
    "HTTP/3.0": b"GET /health HTTP/3.0\r\nHost: localhost\r\n\r\n",
}


def _refused(side: str) -> dict[str, tuple[bytes, int, str]]:
    """Every malformed framing and unsupported version: (request, status, code)."""
    head = b"POST " + target(side) + b" HTTP/1.1\r\nHost: localhost\r\n" + KEY
    rows = {name: (head + framing, 400, "invalid_request") for name, framing in FRAMING.items()}
    for name, raw in VERSIONS.items():
        rows[name] = (raw, 505, "http_version_not_supported")
    return rows


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("row", [*FRAMING, *VERSIONS])
async def test_malformed_framing_is_400_and_other_versions_505_then_close(side, row):
    raw, status, code = _refused(side)[row]
    async with served(side) as (port, _, worker):
        answers, closed = await exchange(port, raw)
    assert [a[0] for a in answers] == [status], answers
    assert answers[0][1][b"connection"] == b"close" and closed
    assert json.loads(answers[0][2])["error"]["code"] == code
    assert worker is None or worker.calls == []


# -- repeated single-valued headers: 400 (item 5) -----------------------------------------
REPEATS = {
    "Authorization": KEY + b"Authorization: Bearer other\r\n",
    "Host": KEY + b"Host: y\r\n",
    "X-Request-Timeout-Ms": KEY + b"X-Request-Timeout-Ms: 100\r\nX-Request-Timeout-Ms: 9\r\n",
    "X-Request-Id": KEY + b"X-Request-Id: first\r\nX-Request-Id: second\r\n",
    "Origin": KEY + b"Origin: http://127.0.0.1\r\nOrigin: https://attacker.example\r\n",
}


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("extra", REPEATS.values(), ids=REPEATS.keys())
async def test_a_repeated_single_valued_header_is_answered_400(side, extra):
    async with served(side) as (port, _, worker):
        raw = b"POST " + target(side) + b" HTTP/1.1\r\nHost: localhost\r\n" + extra
        answers, _ = await exchange(port, raw + b"Content-Length: 0\r\n\r\n")
    assert [a[0] for a in answers] == [400]
    assert b"more than one" in answers[0][2]
    assert worker is None or worker.calls == []


# -- trailers never become headers (item 1) -----------------------------------------------
async def test_a_trailing_authorization_does_not_authenticate():
    async with served("router") as (port, _, _):
        raw = b"POST /api/v1/reload HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
        raw += b"Transfer-Encoding: chunked\r\n\r\n"
        raw += b"0\r\nAuthorization: Bearer k1\r\n\r\n"
        answers, _ = await exchange(port, raw)
    assert [a[0] for a in answers] == [401]


async def test_trailers_are_read_and_dropped_and_the_connection_carries_on():
    seen: list[list] = []

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        seen.append(list(scope["headers"]))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    async with _serve_app(app) as (port, _, _):
        one = b"POST /a HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
        one += b"3\r\nabc\r\n0\r\nAuthorization: Bearer k1\r\nX-Injected: 1\r\n\r\n"
        answers, _ = await exchange(
            port,
            one + b"GET /b HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
            timeout_s=3,
        )
    assert [(a[0], a[2]) for a in answers[:2]] == [(200, b"abc"), (200, b"")]
    names = {name for headers in seen for name, _ in headers}
    assert b"authorization" not in names and b"x-injected" not in names


@pytest.mark.parametrize("side", SIDES)
async def test_trailers_over_the_head_cap_are_answered_431(side):
    async with served(side, max_header_bytes=1024) as (port, _, _):
        trailer = b"X-Pad: " + b"p" * 2000 + b"\r\n"
        answers, closed = await exchange(
            port, chunked(side, b"0\r\n" + trailer + b"\r\n", b"Transfer-Encoding: chunked\r\n")
        )
    assert [a[0] for a in answers] == [431] and closed


@pytest.mark.parametrize("side", SIDES)
async def test_trickled_trailers_are_cut_at_the_head_cap(side):
    """Each read adds to one endless trailer line: llhttp buffers it, so the cap must
    count the raw bytes, not only the complete fields."""
    async with served(side, max_header_bytes=1024) as (port, _, _):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(chunked(side, b"0\r\nX-Endless: ", b"Transfer-Encoding: chunked\r\n"))
        received = b""
        with trio.fail_after(5):
            try:
                for _ in range(64):
                    await stream.send_all(b"a" * 100)
                    await trio.sleep(0.005)
            except trio.BrokenResourceError:
                pass
            try:
                while data := await stream.receive_some(65536):
                    received += data
            except trio.BrokenResourceError:
                pass
    assert [a[0] for a in parse_answers(received)] == [431]


# -- absolute-form targets are routed by their path (item 5) ------------------------------
@pytest.mark.parametrize("side", SIDES)
async def test_an_absolute_form_target_is_served_by_its_path(side):
    async with served(side) as (port, _, worker):
        url = b"http://x" + target(side) + b"?q=1"
        raw = b"POST " + url + b" HTTP/1.1\r\nHost: localhost\r\n" + KEY
        raw += b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(EMBED) + EMBED
        answers, _ = await exchange(port, raw)
    assert [a[0] for a in answers] == [200]
    if worker is not None:
        assert worker.calls == [("POST", "/echo", EMBED)]


@pytest.mark.parametrize("side", SIDES)
async def test_an_asterisk_target_is_400(side):
    async with served(side) as (port, _, _):
        answers, _ = await exchange(port, b"OPTIONS * HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert [a[0] for a in answers] == [400]


# -- answer framing and Date (items 1 and 5) ----------------------------------------------
@pytest.mark.parametrize(
    ("method", "status", "length", "body"),
    [
        (b"GET", 204, None, b""),
        (b"GET", 304, None, b""),
        (b"GET", 200, b"4", b"body"),
        (b"HEAD", 200, b"4", b""),
        (b"HEAD", 204, None, b""),
    ],
)
async def test_answers_are_framed_by_status_and_method(method, status, length, body):
    async with served("worker") as (port, _, _):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        raw = method + b" /status/%d HTTP/1.1\r\nHost: localhost\r\n\r\n" % status
        # and a second request behind it: a body where none belongs would be read as the
        # start of the next answer.
        await stream.send_all(raw + b"GET /status/200 HTTP/1.1\r\nHost: localhost\r\n\r\n")
        received = b""
        with trio.fail_after(5):
            while received.count(b"HTTP/1.1") < 2 or not received.endswith(b"body"):
                received += await stream.receive_some(65536)
        await stream.aclose()
    first, _, rest = received.partition(b"\r\n\r\n")
    lines = first.split(b"\r\n")
    headers = dict(line.split(b": ", 1) for line in lines[1:])
    assert lines[0].startswith(b"HTTP/1.1 %d" % status)
    assert headers.get(b"content-length") == length
    assert rest.startswith(body + b"HTTP/1.1 200 OK\r\n")
    assert headers[b"date"].endswith(b" GMT")


# -- half-close: the caller is gone, on both sides (item 3, 6) ----------------------------
@pytest.mark.parametrize("side", ["worker", "router"])
async def test_a_half_close_is_a_hang_up_on_both_sides(side):
    if side == "worker":
        cm = served("worker")
        raw = b"POST /slow HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n"
    else:
        from .test_app import stalling

        handler, started, cancelled = stalling()
        app, _ = build(api_keys=["k1"], handler=handler)
        cm = _serve_app(app)
        raw = b"POST /v1/embeddings HTTP/1.1\r\nHost: localhost\r\n" + KEY
        raw += b"Content-Length: %d\r\n\r\n" % len(EMBED) + EMBED
    async with cm as (port, _, worker):
        answers, closed = await exchange(port, raw, half_close=True, timeout_s=3)
        if side == "worker":
            assert worker.cancelled == ["/slow"]
        else:
            assert started.is_set() and cancelled == [True]
    assert answers == [] and closed


@asynccontextmanager
async def _serve_app(app):
    server = H1Server(adapter=AsgiAdapter(app))
    async with serving(server) as (port, _):
        yield port, server, None


# -- limits (item 2) ----------------------------------------------------------------------
@pytest.mark.parametrize("side", SIDES)
async def test_a_slow_head_gets_408_counted_from_its_first_byte(side):
    async with served(side, head_timeout_s=0.3, keep_alive_timeout_s=30) as (port, _, _):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await trio.sleep(0.4)  # idle before the first byte: not the head's time
        await stream.send_all(b"GET /health HTTP/1.1\r\nHo")
        started = trio.current_time()
        received = b""
        with trio.fail_after(5):
            while data := await stream.receive_some(65536):
                received += data
    assert [a[0] for a in parse_answers(received)] == [408]
    assert 0.25 < trio.current_time() - started < 2.5


@pytest.mark.parametrize("side", SIDES)
async def test_an_idle_connection_closes_quietly_after_the_keep_alive_timeout(side):
    async with served(side, keep_alive_timeout_s=0.3) as (port, server, _):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        with trio.fail_after(5):
            assert await stream.receive_some(100) == b""
        assert server.open_connections() == 0


async def test_a_caller_that_never_reads_is_reset_after_the_write_timeout():
    async with served("worker", write_timeout_s=0.3) as (port, server, _):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /big HTTP/1.1\r\nHost: localhost\r\n\r\n")  # more than both buffers hold
        with trio.fail_after(5):
            while not server.open_connections():
                await trio.sleep(0.01)
            started = trio.current_time()
            while server.open_connections():
                await trio.sleep(0.05)
        assert trio.current_time() - started > 0.25
        # Dropped with a reset: the kernel is not left retrying the unread answer.
        poller = select.poll()
        poller.register(sock, select.POLLERR | select.POLLHUP)
        assert poller.poll(1000)
        sock.close()


async def test_at_the_connection_cap_the_longest_idle_connection_makes_room():
    async with served("worker", max_connections=3) as (port, _, _):
        streams = []
        for _ in range(3):  # three kept-alive connections, idle after one request each
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"GET /echo HTTP/1.1\r\nHost: localhost\r\n\r\n")
            await stream.receive_some(65536)
            streams.append(stream)
            await trio.sleep(0.01)
        answers, _ = await exchange(
            port, b"GET /echo HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        assert [a[0] for a in answers] == [200]
        with trio.fail_after(2):
            assert await streams[0].receive_some(100) == b""  # the oldest was closed
        await streams[1].send_all(b"GET /echo HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert (await streams[1].receive_some(65536)).startswith(b"HTTP/1.1 200")


async def test_at_the_connection_cap_begun_heads_make_room_for_a_newcomer():
    async with served("worker", max_connections=2) as (port, _, _):
        begun = []
        for _ in range(2):  # two connections in the middle of a head: waiting for their caller
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"GET /echo HTTP/1.1\r\nHo")
            begun.append(stream)
            await trio.sleep(0.01)
        await trio.sleep(0.05)
        answers, _ = await exchange(
            port, b"GET /echo HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        assert [a[0] for a in answers] == [200]
        with trio.fail_after(2):  # the one waiting longest was answered 503 and closed
            received = b""
            while data := await begun[0].receive_some(65536):
                received += data
        assert received.startswith(b"HTTP/1.1 503")


async def test_at_the_connection_cap_with_every_connection_served_a_newcomer_gets_503():
    async with served("worker", max_connections=2) as (port, server, worker):
        busy = []
        for _ in range(2):  # two requests being handled: never cut for a newcomer
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"GET /slow HTTP/1.1\r\nHost: localhost\r\n\r\n")
            busy.append(stream)
        await trio.sleep(0.1)
        answers, closed = await exchange(port, b"GET /echo HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert [a[0] for a in answers] == [503] and closed
        assert answers[0][1][b"retry-after"] == b"1"
        assert server.open_connections() == 2
        assert [c[1] for c in worker.calls] == ["/slow", "/slow"]
