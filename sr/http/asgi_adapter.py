"""An ASGI app (the router's front end) served by sr.http.server (`adapter=AsgiAdapter(app)`).

Per request the app gets a `scope` (method, path, raw_path, query_string, lower-case
headers, and the `sr.hang_up` extension: sr.http.hang_up's poller cancels a scope of the app's
if the caller hangs up), a `receive` that streams the body as the parser hands it over and,
once the body is complete, waits on the socket and answers `http.disconnect` when the
caller hangs up, and a `send` whose answer is written whole (head and body in one socket
write, with its Content-Length) when the last body message arrives. Nothing reads the
socket while the app runs unless the app is in `receive()` for the body; a hang-up wait in
`receive()` only waits for the socket to turn readable and peeks, so a pipelined next
request stays in the kernel until the connection reads it.

The adapter drives the connection only through its public interface (sr.http.server's
`Connection`: the sans-I/O `http` state, `receive_more_body`, `send_answer`, `refuse`, ...); the
connection decides framing and keep-alive. The app owns its body limits
(sr.http.asgi.read_body); sending after the caller left is a no-op, as under hypercorn. An
answer given before the body was read in full closes the connection.
A body whose framing breaks while the app reads it (a bad chunk size, trailers over the
cap) is answered here, 400 or 431, and the app's `receive()` then says `http.disconnect`:
the same answer the worker's handler path gives.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from sr.answer import Answer
from sr.errors import RequestError
from sr.http import hang_up
from sr.http.body import COMPLETE_BODY_EXTENSION
from sr.http.connection import CLOSED, END, NEED_DATA, State
from sr.http.driver import Connection, PeerGone, error_answer
from sr.http.parse import RequestHead
from sr.http.wire import InvalidAnswer

AsgiApp = Callable[
    [dict[str, Any], Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]],
    Awaitable[None],
]

_log = logging.getLogger("sr.http")
_DISCONNECT = {"type": "http.disconnect"}
_ASGI = {"version": "3.0", "spec_version": "2.3"}


class LifespanFailed(Exception):
    """The app answered `lifespan.startup.failed`."""


class AsgiAdapter:
    """`crash_answer`: the answer when the app fails before answering (500)."""

    def __init__(self, app: AsgiApp, *, crash_answer: Answer | None = None):
        self.app = app
        self.crash_answer = crash_answer or error_answer(
            RequestError("the server failed to answer")
        )

    async def lifespan(
        self, ended: Callable[[], Awaitable[None]], *, task_status=trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the app's lifespan: started once it completes startup (or does not speak
        the lifespan protocol), shut down once `ended()` returns."""
        await self._app_lifespan(ended, task_status)
        await ended()  # an app that does not speak the protocol returned at once

    async def _app_lifespan(self, ended: Callable[[], Awaitable[None]], task_status) -> None:
        started = False

        async def receive() -> dict:
            nonlocal started
            if not started:
                started = True
                return {"type": "lifespan.startup"}
            await ended()
            return {"type": "lifespan.shutdown"}

        ready = False

        async def send(message: dict) -> None:
            nonlocal ready
            if message["type"] == "lifespan.startup.complete":
                ready = True
                task_status.started()
            elif message["type"] == "lifespan.startup.failed":
                raise LifespanFailed(message.get("message", ""))

        await self.app({"type": "lifespan", "asgi": _ASGI, "state": {}}, receive, send)
        if not ready:  # the app returned without speaking the lifespan protocol
            task_status.started()

    async def answer(
        self,
        connection: Connection,
        request: RequestHead,
        method: str,
        path: str,
    ) -> bool:
        exchange = _Exchange(connection, request, self.crash_answer)
        scope = {
            "type": "http",
            "asgi": _ASGI,
            "http_version": request.http_version.decode("ascii"),
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": request.raw_path,
            "query_string": request.query,
            "root_path": "",
            "headers": request.headers,
            "client": None,
            "server": None,
        }
        extensions: dict = {COMPLETE_BODY_EXTENSION: {"take": exchange.take_complete_body}}
        if isinstance(connection.stream, trio.SocketStream):
            extensions[hang_up.EXTENSION] = {"watch": exchange.watch_for_hang_up}
        scope["extensions"] = extensions
        return await exchange.run(self.app, scope)


class _Exchange:
    """One request/answer on a connection. The answer is written whole, with its length,
    once the app sends its last body message (the router's answers are small and never
    streamed), so an app that fails half-way still gets a clean 500."""

    def __init__(self, connection: Connection, request: RequestHead, crash: Answer) -> None:
        self.connection = connection
        self.request = request
        self.crash = crash
        self.hang_ups = connection.hang_ups
        self._hang_up_scope: trio.CancelScope | None = None
        self.head_only = request.method == b"HEAD"
        self.gone = False
        self.start: dict | None = None
        self.body_parts: list[bytes] = []
        self.finished = False  # the answer is written (or nobody is left to read it)
        # The app has returned: the connection owns its socket again, and a receive()
        # still pending in a task of the app's answers http.disconnect without touching
        # the socket (the connection may be reading the next request).
        self.over = False

    async def run(self, app: AsgiApp, scope: dict) -> bool:
        """True if the connection may carry another request."""
        failed = False
        try:
            await app(scope, self.receive, self.send)
        except Exception:  # a bug in the app costs this request, never the server
            _log.exception("app failed on %s %s", scope["method"], scope["path"])
            failed = True
        finally:
            self.over = True
            self.stop_watching()
        if not self.finished and not self.gone:
            if not failed:
                _log.error("app returned without answering %s %s", scope["method"], scope["path"])
            await self._fail()
        if self.gone or not self.finished:
            return False
        if not self.body_done:
            await self.connection.linger()
            return False
        return True  # if the connection's state allows it (sr.http.connection, rule 4)

    def take_complete_body(self) -> bytes | None:
        """The COMPLETE_BODY_EXTENSION: the whole body if it is here, without waiting; None
        when `receive` must read it (or a `100 Continue` must be sent first)."""
        if self.gone or self.over or self.body_done:
            return None
        if self.request.expects_continue and not self.finished:
            return None
        return self.connection.http.take_complete_body()

    @property
    def body_done(self) -> bool:
        """The request body was read to its end (the connection notes it as it parses)."""
        return self.connection.http.caller is State.DONE

    def watch_for_hang_up(self, scope: trio.CancelScope) -> Callable[[], None]:
        """The `sr.hang_up` extension: cancel `scope` if the caller hangs up (noticed by
        the server's poller); returns the function that stops watching."""
        self._hang_up_scope = scope
        self.hang_ups.watch(self, self.connection.stream.socket.fileno(), self._hung_up)
        return self.stop_watching

    def stop_watching(self) -> None:
        if self._hang_up_scope is not None:
            self._hang_up_scope = None
            self.hang_ups.unwatch(self)

    def _hung_up(self) -> None:
        self.gone = True
        if self._hang_up_scope is not None:
            self._hang_up_scope.cancel()
            self._hang_up_scope = None

    async def receive(self) -> dict:
        if self.gone or self.over:
            return _DISCONNECT
        if self.body_done:
            return await self._wait_for_hang_up()
        if self.request.expects_continue and not self.finished:
            try:
                await self.connection.send_continue_if_awaited()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.gone = True
                return _DISCONNECT
        http = self.connection.http
        body = http.take_complete_body()  # the usual case: the rest of the body is here whole
        if body is not None:
            return {"type": "http.request", "body": body, "more_body": False}
        chunks: list[bytes] = []
        while True:
            try:
                event = http.next_event()
            except RequestError as error:  # a broken chunked body: answered here
                await self._refuse(error)
                return _DISCONNECT
            if event is NEED_DATA:
                if chunks:  # hand over what has arrived; more follows
                    return {"type": "http.request", "body": b"".join(chunks), "more_body": True}
                if not await self._read():
                    return _DISCONNECT
            elif event is END:  # the connection noted the body complete (body_done)
                body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                return {"type": "http.request", "body": body, "more_body": False}
            elif event is CLOSED:
                self.gone = True
                return _DISCONNECT
            else:
                chunks.append(event)

    async def _read(self) -> bool:
        """More bytes into the parser; False (and gone) when the caller closed, or when the
        connection was reclaimed at the cap while the app waited here (its socket closed)."""
        try:
            await self.connection.receive_more_body()
        except (PeerGone, trio.BrokenResourceError, trio.ClosedResourceError):
            self.gone = True
            return False
        return True

    async def _wait_for_hang_up(self) -> dict:
        """Until the caller hangs up (then `http.disconnect`) or the watch is cancelled.

        On a socket nothing is read: the watch waits for it to turn readable (no failing
        read first: a syscall and a raised BlockingIOError less per request) and peeks.
        End of stream or a reset is a hang-up; bytes are a pipelined next request, left in
        the kernel for the connection to read after this answer, so the watch never
        competes with the connection for bytes even when it wakes as the app stops it."""
        stream = self.connection.stream
        if not isinstance(stream, trio.SocketStream):  # not one sr's listeners make
            await trio.sleep_forever()  # cannot peek: a hang-up shows when the answer is written
        try:
            await trio.lowlevel.wait_readable(stream.socket)
            peeked = b"" if self.over else await stream.socket.recv(1, trio.socket.MSG_PEEK)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            peeked = b""
        if self.over:
            return _DISCONNECT  # the answer is done; the connection has the socket back
        if peeked:
            await trio.sleep_forever()  # a pipelined request: cancelled when the answer is done
        self.gone = True
        return _DISCONNECT

    async def send(self, message: dict) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self.start is not None:
                raise RuntimeError("http.response.start sent twice")
            self.start = message
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        if self.gone:
            return  # nobody is listening (or the server answered); the app may finish quietly
        if self.start is None or self.finished:
            raise RuntimeError("http.response.body outside a response")
        body = message.get("body", b"")
        if body:
            self.body_parts.append(body)
        if message.get("more_body", False):
            return
        body = self.body_parts[0] if len(self.body_parts) == 1 else b"".join(self.body_parts)
        headers = self.start.get("headers", ())
        length = _declared_length(headers)
        if length is None or not self.head_only:
            if length is not None and length != len(body):
                raise InvalidAnswer(f"content-length {length} for a body of {len(body)} bytes")
            length = len(body)
        await self._write(self.start["status"], headers, body, length)

    async def _refuse(self, error: RequestError) -> None:
        """Answer a body that cannot be read; the app is told the caller is gone, and its
        own answer, if any, is dropped."""
        try:
            await self.connection.refuse(error)
        except (PeerGone, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        self.finished = self.gone = True

    async def _fail(self) -> None:
        """Answer 500 if nothing was written yet."""
        if not (self.finished or self.gone):
            status, headers, body = self.crash
            await self._write(status, headers, body, len(body))

    def _drop_unread_body(self) -> None:
        """An app that answers without reading the body (every GET route): if the whole
        body has already arrived (a GET has none), drop it, so that the connection can
        carry the next request instead of closing."""
        http = self.connection.http
        while http.caller is not State.DONE:  # the body is not read to its end
            try:
                event = http.next_event()
            except RequestError:
                return
            if event is not END and not isinstance(event, bytes):
                return  # more is still to come (or the caller closed): not readable now

    async def _write(self, status: int, headers, body: bytes, length: int) -> None:
        self._drop_unread_body()
        try:
            await self.connection.send_answer(status, headers, body, length)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.gone = True
        self.finished = True


def _declared_length(headers) -> int | None:
    """The app's own Content-Length, if it gave one."""
    for name, value in headers:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                raise InvalidAnswer(f"content-length {value[:40]!r} is not a number") from None
    return None
