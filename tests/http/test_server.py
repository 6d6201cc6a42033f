"""sr.http.server over real loopback sockets, driven by raw bytes."""

from __future__ import annotations

import json
import socket

import pytest
import trio

from sr.http.limits import HttpLimits
from sr.http.server import H1Server, open_listeners

JSON = [(b"content-type", b"application/json")]


class Echo:
    """A handler that reports what it got; `/slow` takes `slow_s`, `/boom` raises."""

    def __init__(self, slow_s: float = 0.3) -> None:
        self.calls: list[tuple[str, str, bytes]] = []
        self.slow_s = slow_s

    async def __call__(self, method: str, path: str, body: bytes, headers=()):
        self.calls.append((method, path, body))
        self.headers = list(headers)
        if path == "/boom":
            raise RuntimeError("handler bug")
        if path.startswith("/slow"):
            await trio.sleep(self.slow_s)
        payload = {"method": method, "path": path, "body": body.decode("latin-1")}
        return 200, JSON, json.dumps(payload).encode()


class Running:
    def __init__(self, server: H1Server, port: int, stop: trio.Event, done: trio.Event):
        self.server, self.port, self.stop, self.done = server, port, stop, done

    async def connect(self) -> trio.SocketStream:
        return await trio.open_tcp_stream("127.0.0.1", self.port)


@pytest.fixture
async def serve(nursery):
    async def start(handler=None, *, after_answer=None, **limits) -> Running:
        server = H1Server(handler or Echo(), HttpLimits(**limits), after_answer=after_answer)
        listeners, binds = await open_listeners(host="127.0.0.1", port=0)
        assert binds[0].startswith("http://127.0.0.1:")
        stop, done = trio.Event(), trio.Event()

        async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
            await server.serve(listeners, shutdown_trigger=stop.wait, task_status=task_status)
            done.set()

        await nursery.start(run)
        return Running(server, int(binds[0].rsplit(":", 1)[1]), stop, done)

    return start


def request(path: str = "/x", body: bytes = b"", method: str = "POST", extra: str = "") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: w\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


def _parse_one(buffer: bytes):
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = buffer[:end].decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, value = line.split(":", 1)
        headers[name.strip().lower()] = value.strip()
    length = int(headers["content-length"])  # every answer must declare it
    if len(buffer) < end + 4 + length:
        return None
    body = buffer[end + 4 : end + 4 + length]
    return (int(lines[0].split()[1]), headers, body), buffer[end + 4 + length :]


async def read_answers(stream, count: int, timeout_s: float = 5.0) -> list:
    answers, buffer = [], b""
    with trio.fail_after(timeout_s):
        while len(answers) < count:
            parsed = _parse_one(buffer)
            if parsed is not None:
                answers.append(parsed[0])
                buffer = parsed[1]
                continue
            data = await stream.receive_some(65536)
            if not data:
                break
            buffer += data
    return answers


async def closed_by_server(stream, timeout_s: float = 3.0) -> bool:
    with trio.fail_after(timeout_s):
        try:
            while data := await stream.receive_some(65536):
                raise AssertionError(f"unexpected bytes {data[:80]!r}")
        except trio.BrokenResourceError:
            pass  # a reset is a close too
    return True


async def test_keep_alive_reuses_one_connection(serve):
    handler = Echo()
    running = await serve(handler)
    stream = await running.connect()
    for i in range(3):
        await stream.send_all(request(f"/r{i}", b"hi"))
        [(status, headers, body)] = await read_answers(stream, 1)
        assert status == 200 and json.loads(body)["path"] == f"/r{i}"
        assert headers["content-length"] == str(len(body))
        assert "connection" not in headers
    assert [c[1] for c in handler.calls] == ["/r0", "/r1", "/r2"]


async def test_pipelined_requests_are_answered_in_order(serve):
    running = await serve(Echo(slow_s=0.1))
    stream = await running.connect()
    await stream.send_all(request("/slow", b"1") + request("/b", b"2") + request("/c", b"3"))
    answers = await read_answers(stream, 3)
    assert [json.loads(a[2])["path"] for a in answers] == ["/slow", "/b", "/c"]
    assert [json.loads(a[2])["body"] for a in answers] == ["1", "2", "3"]


async def test_chunked_body_is_reassembled_and_target_decoded(serve):
    running = await serve()
    stream = await running.connect()
    head = b"POST /v1/emb%65ddings?x=1 HTTP/1.1\r\nHost: w\r\nTransfer-Encoding: chunked\r\n\r\n"
    await stream.send_all(head + b"5\r\nhello\r\n")
    await trio.sleep(0.02)
    await stream.send_all(b"6\r\n world\r\n0\r\n\r\n")
    [(status, _, body)] = await read_answers(stream, 1)
    assert status == 200
    assert json.loads(body) == {"method": "POST", "path": "/v1/embeddings", "body": "hello world"}


async def test_body_over_cap_by_header_is_413_and_closes(serve):
    handler = Echo()
    running = await serve(handler, max_body_bytes=100)
    stream = await running.connect()
    await stream.send_all(b"POST /x HTTP/1.1\r\nHost: w\r\nContent-Length: 101\r\n\r\n" + b"a" * 20)
    [(status, headers, body)] = await read_answers(stream, 1)
    assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
    assert headers["connection"] == "close"
    await stream.send_all(b"a" * 81)  # the rest of the body is read and dropped, not a reset
    assert await closed_by_server(stream)
    assert handler.calls == []


async def test_chunked_body_over_cap_while_reading_is_413_and_closes(serve):
    handler = Echo()
    running = await serve(handler, max_body_bytes=100)
    stream = await running.connect()
    head = b"POST /x HTTP/1.1\r\nHost: w\r\nTransfer-Encoding: chunked\r\n\r\n"
    await stream.send_all(head + b"40\r\n" + b"a" * 64 + b"\r\n" + b"40\r\n" + b"b" * 64 + b"\r\n")
    [(status, _, body)] = await read_answers(stream, 1)
    assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
    assert await closed_by_server(stream)
    assert handler.calls == []


async def test_body_not_complete_in_time_is_408_and_closes(serve):
    handler = Echo()
    running = await serve(handler, body_timeout_s=0.2)
    stream = await running.connect()
    await stream.send_all(b"POST /x HTTP/1.1\r\nHost: w\r\nContent-Length: 10\r\n\r\nabc")
    started = trio.current_time()
    [(status, _, body)] = await read_answers(stream, 1)
    assert 0.15 < trio.current_time() - started < 2.0
    assert status == 408 and json.loads(body)["error"]["code"] == "request_timeout"
    assert await closed_by_server(stream)
    assert handler.calls == []


@pytest.mark.parametrize("pieces", [1, 8])  # all at once, or trickled (h11's own limit)
async def test_headers_too_large_is_431_and_closes(serve, pieces):
    running = await serve(max_header_bytes=1024)
    stream = await running.connect()
    head = b"GET /x HTTP/1.1\r\nHost: w\r\nX-Big: " + b"a" * 4096 + b"\r\n\r\n"
    step = len(head) // pieces + 1
    for start in range(0, len(head), step):
        await stream.send_all(head[start : start + step])
        await trio.sleep(0.01)
    [(status, _, body)] = await read_answers(stream, 1)
    assert status == 431 and "error" in json.loads(body)
    assert await closed_by_server(stream)


@pytest.mark.parametrize(
    "garbage",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /x HTTP/1.1\r\nHost: w\r\nContent-Length: nope\r\n\r\n",
        b"GET /x HTTP/1.1\r\nbad header line\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  # a TLS hello
    ],
)
async def test_malformed_request_is_400_json_and_closes(serve, garbage):
    handler = Echo()
    running = await serve(handler)
    stream = await running.connect()
    await stream.send_all(garbage)
    [(status, headers, body)] = await read_answers(stream, 1)
    assert status == 400 and json.loads(body)["error"]["code"] == "invalid_request"
    assert headers["connection"] == "close"
    assert await closed_by_server(stream)
    assert handler.calls == []


async def test_client_gone_mid_body_costs_nothing_but_its_connection(serve):
    handler = Echo()
    running = await serve(handler)
    stream = await running.connect()
    await stream.send_all(b"POST /x HTTP/1.1\r\nHost: w\r\nContent-Length: 100\r\n\r\n0123456789")
    await stream.aclose()
    await trio.sleep(0.05)
    assert handler.calls == [] and not running.server._connections
    other = await running.connect()
    await other.send_all(request("/after"))
    [(status, _, _)] = await read_answers(other, 1)
    assert status == 200


async def test_a_handler_that_finishes_after_its_caller_hung_up_is_not_answered(serve):
    # The hang-up poller cancels the connection's scope, but this handler shields itself
    # and returns normally: its answer must still not be written (sr.http.sockio's writes are
    # no cancel points, so the server checks).
    finished = trio.Event()

    async def shielded(method, path, body, headers):
        with trio.CancelScope(shield=True):
            await trio.sleep(0.3)
        finished.set()
        return 200, JSON, b"{}"

    running = await serve(shielded)
    stream = await running.connect()
    await stream.send_all(request("/x"))
    await stream.send_eof()  # a half-close: the caller is gone
    assert await closed_by_server(stream)
    assert finished.is_set()


async def test_idle_connection_is_closed_after_keep_alive_timeout(serve):
    running = await serve(keep_alive_timeout_s=0.2)
    stream = await running.connect()
    await stream.send_all(request())
    assert len(await read_answers(stream, 1)) == 1
    started = trio.current_time()
    assert await closed_by_server(stream)
    assert 0.15 < trio.current_time() - started < 2.0


async def test_a_caller_that_never_finishes_its_headers_gets_408_then_is_cut_off(serve):
    running = await serve(head_timeout_s=0.2, keep_alive_timeout_s=30)
    stream = await running.connect()
    await stream.send_all(b"POST /x HTTP/1.1\r\nHost: w\r\nX-Slow: ")  # and then nothing
    started = trio.current_time()
    (answer,) = await read_answers(stream, 1)
    assert answer[0] == 408 and answer[1]["connection"] == "close"
    assert await closed_by_server(stream)
    assert 0.15 < trio.current_time() - started < 2.0


async def test_connection_close_is_honoured(serve):
    running = await serve()
    stream = await running.connect()
    await stream.send_all(request(extra="Connection: close\r\n"))
    [(status, headers, _)] = await read_answers(stream, 1)
    assert status == 200 and headers["connection"] == "close"
    assert await closed_by_server(stream)


async def test_head_request_gets_the_head_only(serve):
    running = await serve()
    stream = await running.connect()
    await stream.send_all(request("/h", method="HEAD") + request("/next"))
    answer = b""
    with trio.fail_after(5):
        while answer.count(b"HTTP/1.1") < 2 or not answer.endswith(b"}"):
            answer += await stream.receive_some(65536)
    first, second = answer.split(b"HTTP/1.1 ")[1:]
    assert first.startswith(b"200") and first.endswith(b"\r\n\r\n")  # no body
    assert int(first.split(b"content-length: ")[1].split(b"\r\n")[0]) > 0
    assert second.startswith(b"200") and b'"/next"' in second


async def test_handler_failure_is_500_json_and_the_connection_lives_on(serve):
    running = await serve()
    stream = await running.connect()
    await stream.send_all(request("/boom"))
    [(status, _, body)] = await read_answers(stream, 1)
    assert status == 500 and "error" in json.loads(body)
    await stream.send_all(request("/fine"))
    [(status, _, _)] = await read_answers(stream, 1)
    assert status == 200


async def test_graceful_shutdown_finishes_in_flight_and_closes_idle(serve):
    running = await serve(Echo(slow_s=0.3), graceful_timeout_s=5.0)
    busy, idle = await running.connect(), await running.connect()
    await idle.send_all(request("/warm"))
    assert len(await read_answers(idle, 1)) == 1
    await busy.send_all(request("/slow"))
    await trio.sleep(0.05)
    running.stop.set()
    assert await closed_by_server(idle, timeout_s=0.2)  # idle: closed at once
    [(status, headers, body)] = await read_answers(busy, 1)
    assert status == 200 and json.loads(body)["path"] == "/slow"
    assert headers["connection"] == "close"
    with trio.fail_after(2):
        await running.done.wait()
    with pytest.raises(OSError):
        await running.connect()  # no longer accepting


async def test_shutdown_cancels_what_outlasts_the_grace_period(serve):
    running = await serve(Echo(slow_s=30), graceful_timeout_s=0.2)
    stream = await running.connect()
    await stream.send_all(request("/slow"))
    await trio.sleep(0.05)
    running.stop.set()
    with trio.fail_after(2):
        await running.done.wait()
    assert await closed_by_server(stream)


async def test_after_answer_runs_once_the_answer_is_written(serve):
    """The worker's `exit` fault ends the process in `after_answer`: by then the caller's
    socket must already hold the whole answer."""
    client = socket.socket()
    seen: list[bytes] = []

    def after_answer() -> None:
        seen.append(client.recv(65536, socket.MSG_PEEK | socket.MSG_DONTWAIT))

    running = await serve(after_answer=after_answer)
    client.connect(("127.0.0.1", running.port))
    client.sendall(request("/a"))
    with trio.fail_after(5):
        while not seen:
            await trio.sleep(0.01)
    client.close()
    parsed = _parse_one(seen[0])
    assert parsed is not None and parsed[0][0] == 200 and b'"/a"' in parsed[0][2]


async def test_unix_socket_listener(tmp_path):
    path = str(tmp_path / "w.sock")
    listeners, binds = await open_listeners(uds=path)
    assert binds == [f"unix:{path}"]
    server = H1Server(Echo())
    async with trio.open_nursery() as nursery:
        stop = trio.Event()
        await nursery.start(
            lambda task_status: server.serve(
                listeners, shutdown_trigger=stop.wait, task_status=task_status
            )
        )
        stream = await trio.open_unix_socket(path)
        await stream.send_all(request("/uds"))
        [(status, _, body)] = await read_answers(stream, 1)
        assert status == 200 and json.loads(body)["path"] == "/uds"
        await stream.aclose()
        stop.set()


async def test_expect_100_continue_is_answered_before_the_body_is_read(serve):
    running = await serve()
    stream = await running.connect()
    body = b'{"a": 1}'
    head = request(body=body, extra="Expect: 100-continue\r\n")[: -len(body)]
    await stream.send_all(head)
    got = b""
    with trio.fail_after(5):
        while not got.endswith(b"\r\n\r\n"):
            got += await stream.receive_some(65536)
    assert got == b"HTTP/1.1 100 Continue\r\n\r\n"
    await stream.send_all(body)
    [(status, _, answer)] = await read_answers(stream, 1)
    assert status == 200 and json.loads(answer)["body"] == body.decode()


async def test_a_handler_header_that_would_inject_a_line_is_a_500(serve):
    async def injecting(method, path, body, headers):
        if path == "/bad":
            return 200, [(b"x-a", b"v\r\nset-cookie: evil=1")], b"{}"
        return 200, JSON, b"{}"

    running = await serve(injecting)
    stream = await running.connect()
    await stream.send_all(request("/bad") + request("/good"))
    [(first, headers, _), (second, _, _)] = await read_answers(stream, 2)
    assert first == 500 and "set-cookie" not in headers
    assert second == 200  # the connection lives on


async def test_a_pipelining_caller_cannot_starve_other_connections(serve):
    """Reads and writes that need not wait are no checkpoints (sr.http.sockio), so a cycle that
    found its request already buffered yields before the next: another caller's request
    is served among the pipelined ones, not after all of them. Both connections wake in
    the same scheduler pass; without that yield the pipelining one would run to the end
    of its batch whenever trio happened to run it first, so a few rounds catch it."""
    for _ in range(5):
        handler = Echo()
        running = await serve(handler)
        greedy = socket.create_connection(("127.0.0.1", running.port))
        polite = socket.create_connection(("127.0.0.1", running.port))
        try:
            greedy.sendall(b"".join(request(f"/greedy/{i}") for i in range(100)))
            polite.sendall(request("/polite"))
            with trio.fail_after(5):
                while len(handler.calls) < 101:
                    await trio.sleep(0.01)
        finally:
            greedy.close()
            polite.close()
        order = [path for _, path, _ in handler.calls]
        assert order.index("/polite") < 10, order[:12]


async def test_the_handler_gets_the_request_headers(serve):
    echo = Echo()
    running = await serve(echo)
    stream = await running.connect()
    await stream.send_all(request("/x", b"{}", extra="X-Request-Id: abc\r\n"))
    (answer,) = await read_answers(stream, 1)
    assert answer[0] == 200
    assert (b"x-request-id", b"abc") in echo.headers
    await stream.aclose()
