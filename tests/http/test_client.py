"""sr.http.client and HttpTransport over it, against scripted servers on a Unix socket."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import pytest
import trio

from sr.errors import ConnectFailed, ReadFailed, TransportError, WriteFailed
from sr.http.client import MAX_HEAD_BYTES, Http1Pool, parse_head
from sr.http.hop import Hop
from sr.pool.transport import HttpTransport

OK = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n{"ok": true}'

Handler = Callable[[trio.SocketStream, "Server"], Awaitable[None]]


class Server:
    """Accepts connections on a Unix socket and runs `handler` for each one."""

    def __init__(self, handler: Handler):
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []

    async def read_request(self, stream: trio.SocketStream) -> bytes | None:
        """One whole request (head + content-length body); None on EOF."""
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length:
            body += await stream.receive_some(65536)
        self.requests.append(head + b"\r\n\r\n" + body)
        return body

    async def serve(self, path: str, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await sock.bind(path)
        sock.listen(16)
        listener = trio.SocketListener(sock)
        task_status.started()

        async def one(stream: trio.SocketStream) -> None:
            self.connections += 1
            async with stream:
                await self.handler(stream, self)

        await trio.serve_listeners(one, [listener])


@pytest.fixture
async def serve(nursery, tmp_path):
    async def start(handler: Handler) -> tuple[Server, str]:
        path = str(tmp_path / "w.sock")
        server = Server(handler)
        await nursery.start(server.serve, path)
        return server, path

    return start


async def keep_alive_ok(stream, server):
    while await server.read_request(stream) is not None:
        await stream.send_all(OK)


async def test_reuses_one_connection_for_sequential_requests(serve):
    server, path = await serve(keep_alive_ok)
    pool = Http1Pool(uds=path)
    for _ in range(3):
        status, headers, body = await pool.request("POST", "/v1/embeddings", b'{"input":"x"}')
        assert (status, json.loads(body)) == (200, {"ok": True})
        assert headers["content-type"] == "application/json"
    assert pool.connections_opened == 1 and server.connections == 1
    assert server.requests[0].startswith(b"POST /v1/embeddings HTTP/1.1\r\n")
    assert server.requests[0].endswith(b'\r\n\r\n{"input":"x"}')
    await pool.aclose()


async def test_request_id_and_deployment_travel_as_headers_only_with_their_request(serve):
    server, path = await serve(keep_alive_ok)
    pool = Http1Pool(uds=path)
    await pool.request("POST", "/v1/embeddings", b"{}", Hop("req-1", "minilm"))
    await pool.request("POST", "/v1/embeddings", b"{}")
    transport = HttpTransport(uds=path)
    await transport.exchange("GET", "/health", hop=Hop(request_id="req-2", deployment="d.2"))
    await transport.aclose()
    first, second, third = (request.split(b"\r\n\r\n")[0] for request in server.requests)
    assert b"\r\nx-request-id: req-1\r\n" in first + b"\r\n"
    assert b"\r\nx-sr-deployment: minilm\r\n" in first + b"\r\n"
    assert b"x-request-id" not in second  # the cached request line does not keep them
    assert b"x-sr-deployment" not in second
    assert b"\r\nx-request-id: req-2" in third
    assert b"\r\nx-sr-deployment: d.2" in third
    await pool.aclose()


async def test_concurrent_requests_open_separate_connections_then_reuse_them(serve):
    async def slow_ok(stream, server):
        while await server.read_request(stream) is not None:
            await trio.sleep(0.05)
            await stream.send_all(OK)

    server, path = await serve(slow_ok)
    pool = Http1Pool(uds=path)
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(pool.request, "GET", "/health")
    assert pool.connections_opened == 3
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(pool.request, "GET", "/health")
    assert pool.connections_opened == 3 and server.connections == 3
    await pool.aclose()


async def test_idle_connection_closed_by_worker_is_replaced_before_use(serve):
    async def one_answer_then_close(stream, server):
        if await server.read_request(stream) is not None:
            await stream.send_all(OK)  # keep-alive answer, then the worker closes anyway

    server, path = await serve(one_answer_then_close)
    pool = Http1Pool(uds=path)
    assert (await pool.request("GET", "/health"))[0] == 200
    await trio.sleep(0.05)  # the close reaches the client while the connection is idle
    assert (await pool.request("GET", "/health"))[0] == 200
    assert pool.connections_opened == 2 and len(server.requests) == 2
    await pool.aclose()


async def test_write_failure_on_reused_connection_retries_once_on_a_fresh_one(serve, monkeypatch):
    async def one_answer_then_close(stream, server):
        if await server.read_request(stream) is not None:
            await stream.send_all(OK)

    server, path = await serve(one_answer_then_close)
    pool = Http1Pool(uds=path)
    await pool.request("GET", "/health")
    await trio.sleep(0.05)
    # Pretend the close raced the idle check: the write itself must fail and be retried.
    stale = pool._idle[0]
    monkeypatch.setattr(type(stale), "idle_and_usable", lambda self: True)
    assert (await pool.request("POST", "/v1/embeddings", b"{}"))[0] == 200
    assert pool.connections_opened == 2 and len(server.requests) == 2
    await pool.aclose()


async def test_no_retry_once_the_request_was_sent(serve):
    async def read_then_close(stream, server):
        await server.read_request(stream)  # the worker took the request and died

    server, path = await serve(read_then_close)
    transport = HttpTransport(uds=path)
    with pytest.raises(ReadFailed, match="closed the connection") as failed:
        await transport.exchange("POST", "/v1/embeddings", b"{}")
    assert failed.value.reached_worker  # the type says the worker may have acted on it
    assert len(server.requests) == 1 and server.connections == 1
    await transport.aclose()


async def test_missing_socket_is_a_transport_error(tmp_path):
    transport = HttpTransport(uds=str(tmp_path / "absent.sock"))
    with pytest.raises(ConnectFailed, match="connect failed") as failed:
        await transport.exchange("GET", "/health")
    assert isinstance(failed.value, TransportError) and not failed.value.reached_worker
    await transport.aclose()


async def test_reset_mid_answer_is_a_transport_error_and_the_connection_is_dropped(serve):
    async def half_answer(stream, server):
        await server.read_request(stream)
        await stream.send_all(OK[:40])
        stream.socket.close()

    _, path = await serve(half_answer)
    pool = Http1Pool(uds=path)
    with pytest.raises(ReadFailed):
        await pool.request("GET", "/health")
    assert pool._idle == []
    await pool.aclose()


@pytest.mark.parametrize(
    "answer",
    [
        b"garbage that is not http\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: nope\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"x-big: " + b"a" * 70000 + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\ncontent-length: -5\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2, 2\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"x-h: " + b"a" * (MAX_HEAD_BYTES - 20) + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nbad header\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n folded: x\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/2 200 OK\r\ncontent-length: 0\r\n\r\n",
    ],
    ids=[
        "not-http",
        "bad-content-length",
        "huge-head",
        "no-content-length",
        "negative-length",
        "list-length",
        "conflicting-lengths",
        "chunked",
        "head-just-over-cap",
        "header-without-colon",
        "obs-fold",
        "http2-status-line",
    ],
)
async def test_malformed_answer_is_a_transport_error(serve, answer):
    async def bad(stream, server):
        await server.read_request(stream)
        await stream.send_all(answer)
        await trio.sleep(1)

    _, path = await serve(bad)
    pool = Http1Pool(uds=path)
    with trio.fail_after(5), pytest.raises(ReadFailed, match="malformed"):
        await pool.request("GET", "/health")
    assert pool._idle == []
    await pool.aclose()


async def test_oversized_answer_is_refused_and_costs_the_connection(serve):
    big = b"x" * 5000

    async def oversized(stream, server):
        while await server.read_request(stream) is not None:
            await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5000\r\n\r\n" + big)

    _, path = await serve(oversized)
    pool = Http1Pool(uds=path, max_response_bytes=1000)
    with pytest.raises(ReadFailed, match="exceeds 1000 bytes"):
        await pool.request("GET", "/health")
    assert pool._idle == []
    await pool.aclose()


async def test_cancel_mid_answer_closes_the_connection_instead_of_pooling_it(serve):
    release = trio.Event()

    async def stall_mid_body(stream, server):
        while await server.read_request(stream) is not None:
            if len(server.requests) == 1:
                await stream.send_all(OK[:-4])  # head and part of the body, then stall
                await release.wait()
                return
            await stream.send_all(OK)

    server, path = await serve(stall_mid_body)
    pool = Http1Pool(uds=path)
    with trio.move_on_after(0.2) as scope:
        await pool.request("GET", "/health")
    assert scope.cancelled_caught
    assert pool._idle == []  # the half-read connection was not kept
    release.set()
    assert (await pool.request("GET", "/health"))[0] == 200
    assert pool.connections_opened == 2 and server.connections == 2
    await pool.aclose()


async def test_a_request_cancelled_before_it_is_sent_never_reaches_the_worker(serve):
    # sr.http.sockio's writes are no cancel points; the pool checks before sending, so a
    # dispatch whose caller already hung up costs the worker nothing, even on a kept
    # connection whose socket is ready to write.
    server, path = await serve(keep_alive_ok)
    pool = Http1Pool(uds=path)
    assert (await pool.request("GET", "/health"))[0] == 200
    with trio.CancelScope() as scope:
        scope.cancel()
        await pool.request("POST", "/v1/embeddings", b'{"input":"x"}')
    assert scope.cancelled_caught
    assert (await pool.request("GET", "/health"))[0] == 200
    assert [r.split(b" ", 2)[:2] for r in server.requests] == [[b"GET", b"/health"]] * 2
    await pool.aclose()


async def test_connection_close_answer_is_not_kept(serve):
    async def close_header(stream, server):
        await server.read_request(stream)
        head = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n"
        await stream.send_all(head + b"{}")

    _, path = await serve(close_header)
    pool = Http1Pool(uds=path)
    assert await pool.request("GET", "/health") == (
        200,
        {"connection": "close", "content-length": "2"},
        b"{}",
    )
    assert pool._idle == []
    await pool.aclose()


async def test_closed_pool_refuses_requests(serve):
    _, path = await serve(keep_alive_ok)
    pool = Http1Pool(uds=path)
    await pool.request("GET", "/health")
    await pool.aclose()
    assert pool._idle == []
    with pytest.raises(ConnectFailed, match="closed"):
        await pool.request("GET", "/health")


WHOLE = (
    b"HTTP/1.1 100 Continue\r\n\r\n"
    b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nX-Id:  7 \r\n"
    b'content-length: 12\r\n\r\n{"ok": true}'
)


@pytest.mark.parametrize("split", range(1, len(WHOLE)))
async def test_answer_split_at_any_byte_boundary_parses_the_same(serve, split):
    async def split_answer(stream, server):
        while await server.read_request(stream) is not None:
            await stream.send_all(WHOLE[:split])
            await trio.sleep(0.001)  # the client sees the two parts in separate reads
            await stream.send_all(WHOLE[split:])

    _, path = await serve(split_answer)
    pool = Http1Pool(uds=path)
    with trio.fail_after(5):
        status, headers, body = await pool.request("GET", "/health")
    assert (status, body) == (201, b'{"ok": true}')
    assert headers == {"content-type": "application/json", "x-id": "7", "content-length": "12"}
    assert len(pool._idle) == 1  # a complete keep-alive answer keeps its connection
    await pool.aclose()


async def test_bytes_past_the_declared_length_cost_the_connection_not_the_answer(serve):
    async def trailing_bytes(stream, server):
        while await server.read_request(stream) is not None:
            await stream.send_all(OK + b"junk")

    _, path = await serve(trailing_bytes)
    pool = Http1Pool(uds=path)
    status, _, body = await pool.request("GET", "/health")
    assert (status, json.loads(body)) == (200, {"ok": True})
    assert pool._idle == []
    await pool.aclose()


async def test_head_at_the_cap_is_accepted(serve):
    filler = b"x-h: " + b"a" * (MAX_HEAD_BYTES - 80) + b"\r\n"
    answer = b"HTTP/1.1 200 OK\r\n" + filler + b"content-length: 2\r\n\r\n{}"
    assert answer.index(b"\r\n\r\n") <= MAX_HEAD_BYTES

    async def big_head(stream, server):
        await server.read_request(stream)
        await stream.send_all(answer)

    _, path = await serve(big_head)
    pool = Http1Pool(uds=path)
    assert (await pool.request("GET", "/health"))[2] == b"{}"
    await pool.aclose()


async def test_eof_before_the_head_ends_is_a_transport_error(serve):
    async def half_head(stream, server):
        await server.read_request(stream)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-len")

    _, path = await serve(half_head)
    transport = HttpTransport(uds=path)
    with trio.fail_after(5), pytest.raises(TransportError, match="closed the connection"):
        await transport.exchange("GET", "/health")
    await transport.aclose()


def test_parse_head_rules():
    assert parse_head(b"HTTP/1.1 204 No Content") == (204, {}, None, True)
    assert parse_head(b"HTTP/1.0 200 OK\r\ncontent-length: 0")[3] is False
    assert parse_head(b"HTTP/1.1 200 OK\r\nConnection: Close\r\ncontent-length: 0")[3] is False
    assert parse_head(b"HTTP/1.1 200\r\ncontent-length: 0\r\ncontent-length: 0")[2] == 0
    with pytest.raises(ReadFailed, match="content-length"):
        parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: " + b"9" * 30)
    with pytest.raises(ReadFailed, match="status line"):
        parse_head(b"HTTP/1.1 20 OK")


async def test_request_head_is_built_without_a_library(serve):
    server, path = await serve(keep_alive_ok)
    pool = Http1Pool(uds=path)
    await pool.request("POST", "/v1/embeddings", b"{}")
    await pool.request("POST", "/v1/empty")
    await pool.request("GET", "/health")
    assert server.requests == [
        b"POST /v1/embeddings HTTP/1.1\r\nhost: worker\r\ncontent-length: 2\r\n"
        b"content-type: application/json\r\n\r\n{}",
        b"POST /v1/empty HTTP/1.1\r\nhost: worker\r\ncontent-length: 0\r\n\r\n",
        b"GET /health HTTP/1.1\r\nhost: worker\r\n\r\n",
    ]
    with pytest.raises(WriteFailed, match="request target"):
        await pool.request("GET", "/a b")
    with pytest.raises(WriteFailed, match="method"):
        await pool.request("G T", "/health")
    await pool.aclose()
