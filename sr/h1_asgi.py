"""An ASGI app (the router's front end) served by sr.h1_server (`adapter=AsgiAdapter(app)`).

Per request the app gets a `scope` (method, path, raw_path, query_string, lower-case
headers), a `receive` that streams the body as h11 hands it over and, once the body is
complete, waits on the socket and answers `http.disconnect` when the caller hangs up (data
arriving then is a pipelined next request: h11 keeps it for the next cycle), and a `send`
that writes the head and a complete body in one socket write. Nothing reads the socket
while the app runs unless the app is in `receive()`: the router's disconnect watcher is
that reader, only while a dispatch is in flight, so noticing a hang-up costs nothing else.

The app owns its body limits (sr.asgi.read_body); sending after the caller left is a no-op,
as under hypercorn. An answer given before the body was read in full closes the connection.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import h11
import trio

from sr.h1_server import READ_CHUNK, REASONS, Connection, PeerGone

AsgiApp = Callable[
    [dict[str, Any], Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]],
    Awaitable[None],
]

_log = logging.getLogger("sr.http")
_DISCONNECT = {"type": "http.disconnect"}
_ASGI = {"version": "3.0", "spec_version": "2.3"}
# While waiting for a hang-up, a caller that pipelines more than this is not read further
# (the bytes wait in the kernel until the current answer is written).
_PIPELINE_BUFFER_BYTES = 64 * 1024
_FAILED = b'{"error":{"code":"internal_error","message":"the router failed to answer"}}'


class LifespanFailed(Exception):
    """The app answered `lifespan.startup.failed`."""


class AsgiAdapter:
    def __init__(self, app: AsgiApp) -> None:
        self.app = app

    async def lifespan(
        self, ended: Callable[[], Awaitable[None]], *, task_status=trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the app's lifespan: started once it completes startup (or does not speak
        the lifespan protocol), shut down once `ended()` returns."""
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
        request: h11.Request,
        method: str,
        path: str,
        raw_path: bytes,
        query: bytes,
    ) -> bool:
        exchange = _Exchange(connection, request)
        scope = {
            "type": "http",
            "asgi": _ASGI,
            "http_version": request.http_version.decode("ascii"),
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": request.headers,
            "client": None,
            "server": None,
        }
        return await exchange.run(self.app, scope)


class _Exchange:
    """One request/answer on a connection."""

    def __init__(self, connection: Connection, request: h11.Request) -> None:
        self.connection = connection
        self.h11 = connection.h11
        self.head_only = request.method == b"HEAD"
        self.body_done = False
        self.gone = False
        self.start: dict | None = None
        self.head_sent = False
        self.finished = False

    async def run(self, app: AsgiApp, scope: dict) -> bool:
        """True if the connection may carry another request."""
        try:
            await app(scope, self.receive, self.send)
        except Exception:  # a bug in the app costs this request, never the server
            _log.exception("app failed on %s %s", scope["method"], scope["path"])
            if not self.head_sent:
                self.start = {"status": 500, "headers": [(b"content-type", b"application/json")]}
                await self.send({"type": "http.response.body", "body": _FAILED})
        if not self.head_sent and not self.gone:
            _log.error("app returned without answering %s %s", scope["method"], scope["path"])
            self.start = {"status": 500, "headers": [(b"content-type", b"application/json")]}
            await self.send({"type": "http.response.body", "body": _FAILED})
        if self.gone or not self.finished:
            return False
        if not self.body_done:
            await self.connection.linger()
            return False
        return True

    async def receive(self) -> dict:
        if self.gone:
            return _DISCONNECT
        if self.body_done:
            return await self._wait_for_hang_up()
        if self.h11.they_are_waiting_for_100_continue and not self.head_sent:
            go_on = self.h11.send(h11.InformationalResponse(status_code=100))
            if not await self._write(go_on):
                return _DISCONNECT
        chunks: list[bytes] = []
        while True:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError:  # a broken chunked body: nothing more to read
                self.gone = True
                return _DISCONNECT
            if event is h11.NEED_DATA:
                if chunks:  # hand over what has arrived; more follows
                    return {"type": "http.request", "body": b"".join(chunks), "more_body": True}
                if not await self._read():
                    return _DISCONNECT
            elif isinstance(event, h11.Data):
                chunks.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self.body_done = True
                body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                return {"type": "http.request", "body": body, "more_body": False}
            else:  # ConnectionClosed
                self.gone = True
                return _DISCONNECT

    async def _read(self) -> bool:
        """More bytes into h11; False (and gone) when the caller closed."""
        try:
            await self.connection.receive_more()
        except (PeerGone, trio.BrokenResourceError, trio.ClosedResourceError):
            self.gone = True
            return False
        return True

    async def _wait_for_hang_up(self) -> dict:
        stream = self.connection.stream
        # A watch is almost always cancelled before anything arrives: on a socket, wait for
        # it to turn readable instead of first trying a read that fails (a syscall and a
        # raised BlockingIOError less per request, about 8 us of the watch's 44).
        on_socket = isinstance(stream, trio.SocketStream)
        while True:
            try:
                if on_socket:
                    await trio.lowlevel.wait_readable(stream.socket)
                data = await stream.receive_some(READ_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                self.gone = True
                self.connection.eof = True
                return _DISCONNECT
            self.h11.receive_data(data)  # a pipelined next request, served after this one
            if len(self.h11.trailing_data[0]) > _PIPELINE_BUFFER_BYTES:
                await trio.sleep_forever()  # cancelled when the answer is done

    async def send(self, message: dict) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self.head_sent or self.start is not None:
                raise RuntimeError("http.response.start sent twice")
            self.start = message
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        if self.start is None or self.finished:
            raise RuntimeError("http.response.body outside a response")
        if self.gone:
            return  # nobody is listening; the app may finish quietly
        body = message.get("body", b"")
        more = message.get("more_body", False)
        out = b""
        if not self.head_sent:
            self.head_sent = True
            out = self.h11.send(self._head())
        if body and not self.head_only:
            out += self.h11.send(h11.Data(data=body))
        if not more:
            self.finished = True
            out += self.h11.send(h11.EndOfMessage())
        await self._write(out)

    def _head(self) -> h11.Response:
        status = self.start["status"]
        headers = list(self.start.get("headers", ()))
        if self.connection.server.stopping or not self.body_done:
            headers.append((b"connection", b"close"))
        return h11.Response(status_code=status, headers=headers, reason=REASONS.get(status, b""))

    async def _write(self, data: bytes) -> bool:
        try:
            await self.connection.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.gone = True
            return False
        return True
