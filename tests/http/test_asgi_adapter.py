"""RouterApp served by sr.http.server through sr.http.asgi_adapter, over real loopback sockets."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager

import h11
import trio
import trio.testing

from sr.http.asgi_adapter import AsgiAdapter
from sr.http.body import COMPLETE_BODY_EXTENSION
from sr.http.limits import HttpLimits
from sr.http.server import H1Server
from tests.router.fake_core import echo_embeddings
from tests.router.serving import serving
from tests.router.test_app import CANCELED_LINE, build, stalling

EMBED = json.dumps({"model": "primary", "input": "a"}).encode()


@asynccontextmanager
async def served(app, grace_s: float = 5.0):
    """The app on 127.0.0.1:<free port>; yields (port, stop); graceful stop on exit."""
    server = H1Server(adapter=AsgiAdapter(app), limits=HttpLimits(graceful_timeout_s=grace_s))
    async with serving(server) as (port, stop):
        yield port, stop


def post(path: str, body: bytes, *extra: bytes) -> bytes:
    head = b"POST " + path.encode() + b" HTTP/1.1\r\nHost: localhost\r\n"
    head += b"Content-Length: " + str(len(body)).encode() + b"\r\n"
    return head + b"".join(h + b"\r\n" for h in extra) + b"\r\n" + body


class Client:
    """Raw bytes out, h11-parsed answers in."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)

    async def answer(self, method: bytes = b"POST") -> tuple[int, dict[bytes, bytes], bytes]:
        # The client side of h11 must know what was asked (HEAD answers carry no body).
        self.h11.send(h11.Request(method=method, target="/", headers=[("host", "x")]))
        self.h11.send(h11.EndOfMessage())
        status, headers, body = 0, {}, b""
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(await self.stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                status, headers = event.status_code, dict(event.headers)
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
                    self.h11.start_next_cycle()
                return status, headers, body
            else:
                raise AssertionError(f"unexpected {event!r}")


async def connect(port: int) -> Client:
    return Client(await trio.open_tcp_stream("127.0.0.1", port))


async def test_headers_body_and_keep_alive_reach_the_app():
    app, core = build(api_keys=["k1"])
    with trio.fail_after(5):
        async with served(app) as (port, _):
            client = await connect(port)
            auth = b"Authorization: Bearer k1"
            await client.stream.send_all(
                post("/v1/embeddings", EMBED, auth, b"X-Request-Timeout-Ms: 250")
            )
            status, headers, body = await client.answer()
            assert status == 200
            assert json.loads(body)["model"] == "primary"
            assert headers[b"content-length"] == str(len(body)).encode()
            assert headers[b"x-sr-replica"] == b"primary-0"
            assert core.calls[0][3] == 0.25
            # Same connection: the next request, then a missing key.
            await client.stream.send_all(post("/v1/classify", EMBED, auth))
            assert (await client.answer())[0] == 200
            await client.stream.send_all(post("/v1/classify", EMBED))
            status, headers, _ = await client.answer()
            assert status == 401
            assert headers[b"www-authenticate"] == b"Bearer"
            await client.stream.aclose()
    assert len(core.calls) == 2


async def test_caller_hanging_up_mid_dispatch_is_canceled():
    handler, started, cancelled = stalling()
    app, _ = build(handler=handler)
    with trio.fail_after(5):
        async with served(app) as (port, _):
            client = await connect(port)
            await client.stream.send_all(post("/v1/embeddings", EMBED))
            await started.wait()
            await client.stream.aclose()
            while not cancelled:
                await trio.sleep(0.01)
            assert CANCELED_LINE in app.metrics.render().decode()
            # The server carries on for the next caller.
            other = await connect(port)
            await other.stream.send_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert (await other.answer(b"GET"))[0] == 200
            await other.stream.aclose()


async def test_pipelined_request_during_a_dispatch_is_answered_after_it():
    release = trio.Event()
    calls = []

    async def handler(deployment, path, raw, timeout_s):
        calls.append(path)
        await release.wait()

        return await echo_embeddings(deployment, path, raw, timeout_s)

    app, _ = build(handler=handler)
    with trio.fail_after(5):
        async with served(app) as (port, _):
            client = await connect(port)
            both = post("/v1/embeddings", EMBED) + post("/v1/classify", EMBED)
            await client.stream.send_all(both)
            while not calls:
                await trio.sleep(0.01)
            await trio.sleep(0.05)  # the watcher has seen the second request (left unread)
            assert calls == ["/v1/embeddings"]
            release.set()
            assert (await client.answer())[0] == 200
            assert (await client.answer())[0] == 200
            assert calls == ["/v1/embeddings", "/v1/classify"]
            await client.stream.aclose()


async def test_body_caps_answer_413_and_close():
    app, core = build(max_body=100)
    big = json.dumps({"model": "primary", "input": "x" * 300}).encode()
    with trio.fail_after(5):
        async with served(app) as (port, _):
            client = await connect(port)
            await client.stream.send_all(post("/v1/embeddings", big))
            status, headers, body = await client.answer()
            assert status == 413
            assert json.loads(body)["error"]["code"] == "request_too_large"
            chunked = await connect(port)
            head = (
                b"POST /v1/embeddings HTTP/1.1\r\nHost: localhost\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            piece = b"40\r\n" + b"x" * 64 + b"\r\n"
            await chunked.stream.send_all(head + piece + piece)
            status, headers, _ = await chunked.answer()
            assert status == 413
            assert headers[b"connection"] == b"close"
            assert await chunked.stream.receive_some(100) == b""  # closed by the server
    assert core.calls == []


async def test_head_has_no_body_and_shutdown_lets_in_flight_finish():
    release = trio.Event()

    async def handler(deployment, path, raw, timeout_s):
        await release.wait()

        return await echo_embeddings(deployment, path, raw, timeout_s)

    app, core = build(handler=handler)
    answers = []
    with trio.fail_after(5):
        async with served(app) as (port, stop):
            client = await connect(port)
            await client.stream.send_all(b"HEAD /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            status, headers, body = await client.answer(b"HEAD")
            assert (status, body) == (200, b"")
            assert headers[b"content-length"] == b"15"  # as for GET: {"status":"ok"}
            busy = await connect(port)

            async def in_flight():
                await busy.stream.send_all(post("/v1/embeddings", EMBED))
                answers.append(await busy.answer())

            async with trio.open_nursery() as nursery:
                nursery.start_soon(in_flight)
                while not core.calls:
                    await trio.sleep(0.01)
                stop.set()
                await trio.sleep(0.05)
                assert await client.stream.receive_some(100) == b""  # idle: closed at once
                release.set()
    assert answers[0][0] == 200
    assert answers[0][1][b"connection"] == b"close"


async def test_get_routes_keep_the_connection_and_http_1_0_closes_it():
    app, _ = build()
    with trio.fail_after(5):
        async with served(app) as (port, _):
            client = await connect(port)
            for _ in range(2):  # the app never reads a GET's (empty) body
                await client.stream.send_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
                status, headers, _ = await client.answer(b"GET")
                assert status == 200 and b"connection" not in headers
            old = await trio.open_tcp_stream("127.0.0.1", port)
            await old.send_all(b"GET /health HTTP/1.0\r\n\r\n")
            answer = b""
            while data := await old.receive_some(65536):
                answer += data  # read until the server closes
            assert answer.startswith(b"HTTP/1.1 200 ")
            assert b"\r\nconnection: close\r\n" in answer


def _scripted_app(*messages: dict):
    """An ASGI app that sends `messages` as they are (a lifespan is simply not spoken)."""

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await receive()
        for message in messages:
            await send(message)

    return app


def _start(*headers: tuple[bytes, bytes]) -> dict:
    return {"type": "http.response.start", "status": 200, "headers": list(headers)}


def _body(data: bytes, more: bool = False) -> dict:
    return {"type": "http.response.body", "body": data, "more_body": more}


async def _answer_of(app) -> tuple[int, dict[bytes, bytes], bytes]:
    async with served(app) as (port, _):
        client = await connect(port)
        await client.stream.send_all(post("/x", b"{}"))
        return await client.answer()


async def test_a_streamed_answer_is_written_whole_with_its_length():
    app = _scripted_app(
        _start((b"content-type", b"text/plain"), (b"transfer-encoding", b"chunked")),
        _body(b"one ", more=True),
        _body(b"", more=True),
        _body(b"two"),
    )
    with trio.fail_after(5):
        status, headers, body = await _answer_of(app)
    assert (status, body) == (200, b"one two")
    assert headers[b"content-length"] == b"7" and b"transfer-encoding" not in headers


async def test_an_app_declaring_a_wrong_length_gets_a_500():
    app = _scripted_app(_start((b"content-length", b"10")), _body(b"short"))
    with trio.fail_after(5):
        status, _, body = await _answer_of(app)
    assert status == 500 and json.loads(body)["error"]["code"] == "internal_error"


async def test_an_app_header_that_would_inject_a_line_gets_a_500():
    app = _scripted_app(_start((b"x-name", b"a\r\nset-cookie: evil=1")), _body(b"{}"))
    with trio.fail_after(5):
        status, headers, _ = await _answer_of(app)
    assert status == 500 and b"set-cookie" not in headers


async def test_an_app_failing_half_way_through_its_answer_gets_a_clean_500():
    async def app(scope, receive, send):
        if scope["type"] == "http":
            await receive()
            await send(_start())
            await send(_body(b"partial", more=True))
            raise RuntimeError("app bug")

    with trio.fail_after(5):
        status, _, body = await _answer_of(app)
    assert status == 500 and b"partial" not in body


async def test_expect_100_continue_is_answered_when_the_app_reads_the_body():
    app, core = build()
    with trio.fail_after(5):
        async with served(app) as (port, _):
            client = await connect(port)
            head = post("/v1/embeddings", EMBED, b"Expect: 100-continue")[: -len(EMBED)]
            await client.stream.send_all(head)
            got = b""
            while not got.endswith(b"\r\n\r\n"):
                got += await client.stream.receive_some(65536)
            assert got == b"HTTP/1.1 100 Continue\r\n\r\n"
            await client.stream.send_all(EMBED)
            assert (await client.answer())[0] == 200
    assert len(core.calls) == 1


async def test_an_app_waiting_in_receive_after_the_body_sees_the_caller_hang_up():
    """Plain ASGI (no sr.http.hang_up extension used): receive() after the body blocks until
    the caller hangs up, then answers http.disconnect."""
    seen = []
    got_body = trio.Event()

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        assert (await receive())["more_body"] is False
        got_body.set()
        seen.append((await receive())["type"])

    with trio.fail_after(5):
        async with served(app) as (port, _):
            client = await connect(port)
            await client.stream.send_all(post("/x", b"{}"))
            await got_body.wait()
            await client.stream.aclose()
            while not seen:
                await trio.sleep(0.01)
    assert seen == ["http.disconnect"]


async def test_the_apps_lifespan_shutdown_runs_to_its_end():
    events: list[str] = []

    async def app(scope, receive, send):
        if scope["type"] != "lifespan":
            return
        await receive()
        events.append("startup")
        await send({"type": "lifespan.startup.complete"})
        await receive()
        await trio.sleep(0.05)  # a shutdown that waits, e.g. to flush something
        events.append("shutdown")
        await send({"type": "lifespan.shutdown.complete"})

    with trio.fail_after(5):
        async with served(app) as (_, stop):
            assert events == ["startup"]
            stop.set()
    assert events == ["startup", "shutdown"]


async def test_a_body_that_came_with_its_head_is_taken_whole_and_a_trickled_one_is_not():
    """The sr.complete_body extension (sr.http.body): the whole body at once when it is
    here, so the app need not time its read; None when it is still coming, and then
    `receive` reads it as usual."""
    seen: list[bytes | None] = []

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            return
        seen.append(scope["extensions"][COMPLETE_BODY_EXTENSION]["take"]())
        body = seen[-1]
        if body is None:
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    with trio.fail_after(5):
        async with served(app) as (port, _):
            client = await connect(port)
            await client.stream.send_all(post("/x", b'{"a": 1}'))
            assert (await client.answer())[2] == b'{"a": 1}'
            head = post("/x", b'{"b": 2}')
            await client.stream.send_all(head[:-4])  # the head and the body's start
            await trio.testing.wait_all_tasks_blocked()
            await client.stream.send_all(head[-4:])
            assert (await client.answer())[2] == b'{"b": 2}'
            await client.stream.aclose()
    assert seen == [b'{"a": 1}', None]
