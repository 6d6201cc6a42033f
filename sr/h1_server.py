"""sr's HTTP/1.1 server over trio streams, for the worker and the router's front end.

It exists because hypercorn cost about half a millisecond of CPU per request (bench/
narrative.md): on the worker that CPU competes with the model's forwards, on the router it
was most of the hop's overhead. The worker's handler is called directly,
`handler(method, path, body)`; the router's front end is an ASGI app, served through
`adapter=sr.h1_asgi.AsgiAdapter(app)` (streamed body, `http.disconnect` when the caller
hangs up, lifespan).
Only what the router, its workers and direct callers need is here (no HTTP/2, no TLS):

* requests parsed by llhttp (sr.h1_parse); answers written by sr.h1_wire, whole and with
  their length; socket reads and writes by sr.sockio (a checkpoint only when waiting);
* keep-alive, one request at a time per connection; pipelined requests are answered in
  order (what arrives early waits in the parser; while a request is served nothing more
  is read);
* Content-Length and chunked request bodies, capped in size (413, from the declared
  length and while reading) and in time (408 when the body is not complete in time);
* a header-size cap (431), malformed requests answered 400 and the connection closed;
* an idle keep-alive timeout, `Connection: close` honoured, every answer with Content-Length;
* graceful shutdown: stop accepting, close idle connections, let requests in flight finish
  within a grace period, then cancel what is left.

Any answer given before the request body was read in full closes the connection afterwards,
since the rest of that body cannot be told apart from a next request.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol
from urllib.parse import unquote_to_bytes

import attrs
import trio

from sr import sockio
from sr.asgi import BODY_READ_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES
from sr.errors import BodyReadTimeout, InvalidRequest, RequestError, RequestTooLarge
from sr.h1_parse import END, NEED_DATA, RequestHead, RequestParser
from sr.h1_wire import CONTINUE, InvalidAnswer, answer_head

Response = tuple[int, list[tuple[bytes, bytes]], bytes]
Handler = Callable[[str, str, bytes], Awaitable[Response]]


class Adapter(Protocol):
    """What serves an app other than a plain handler (sr.h1_asgi.AsgiAdapter)."""

    async def lifespan(self, ended: Callable[[], Awaitable[None]], *, task_status) -> None: ...
    async def answer(self, connection: Connection, request: RequestHead, method: str,
                     path: str, raw_path: bytes, query: bytes) -> bool: ...  # fmt: skip


_log = logging.getLogger("sr.http")
READ_CHUNK = 65536
_JSON = (b"content-type", b"application/json")
# After an early answer (413, 408) the caller may still be sending; reading (and dropping)
# for a short while lets it see the answer instead of a reset connection.
_LINGER_S = 1.0
# accept() failures that mean "out of resources for now", not "listener broken".
_ACCEPT_RETRY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}


@attrs.frozen
class ServerLimits:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    body_timeout_s: float = BODY_READ_TIMEOUT_S
    max_header_bytes: int = 16 * 1024
    # The router keeps its connections to a worker open between requests; a long idle
    # timeout keeps the race "worker closes as the router reuses" rare.
    keep_alive_timeout_s: float = 75.0
    graceful_timeout_s: float = 5.0


class PeerGone(Exception):
    """The caller closed or reset the connection; nobody is left to answer."""


class H1Server:
    """Serves `handler(method, path, body) -> (status, headers, body)`, or an app through
    an adapter (`adapter=sr.h1_asgi.AsgiAdapter(app)`, with its lifespan), on trio listeners.

    `after_answer()` runs once each answer has been written (the worker's `exit` fault).
    With an adapter the app enforces its own body caps; `limits.max_body_bytes` and
    `body_timeout_s` apply to `handler` only.
    """

    def __init__(
        self,
        handler: Handler | None = None,
        limits: ServerLimits = ServerLimits(),
        *,
        adapter: Adapter | None = None,
        after_answer: Callable[[], None] | None = None,
    ) -> None:
        if (handler is None) == (adapter is None):
            raise ValueError("H1Server serves exactly one of handler or adapter")
        self.handler = handler
        self.adapter = adapter
        self.limits = limits
        self.after_answer = after_answer
        self.stopping = False
        self._connections: set[Connection] = set()

    async def serve(
        self,
        listeners: Sequence[trio.abc.Listener],
        *,
        shutdown_trigger: Callable[[], Awaitable[None]] = trio.sleep_forever,
        task_status=trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept until `shutdown_trigger` returns, then shut down gracefully: stop
        accepting, close idle connections, give requests in flight `graceful_timeout_s`,
        then end an ASGI app's lifespan."""
        async with trio.open_nursery() as lifespan:
            lifespan_ended = trio.Event()
            if self.adapter is not None:
                await lifespan.start(self.adapter.lifespan, lifespan_ended.wait)
            async with trio.open_nursery() as connections:
                async with trio.open_nursery() as accepting:
                    for listener in listeners:
                        accepting.start_soon(self._accept_loop, listener, connections)
                    task_status.started()
                    await shutdown_trigger()
                    accepting.cancel_scope.cancel()
                for listener in listeners:
                    await listener.aclose()
                self.stopping = True
                for connection in list(self._connections):
                    connection.stop_if_idle()
                grace = self.limits.graceful_timeout_s
                connections.cancel_scope.deadline = trio.current_time() + grace
            lifespan_ended.set()

    async def _accept_loop(self, listener: trio.abc.Listener, nursery: trio.Nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as error:
                if error.errno not in _ACCEPT_RETRY_ERRNOS:
                    raise
                _log.warning("accept failed (%s); retrying shortly", error)
                await trio.sleep(0.1)
                continue
            nursery.start_soon(self._serve_connection, stream)

    async def _serve_connection(self, stream: trio.abc.Stream) -> None:
        connection = Connection(self, stream)
        self._connections.add(connection)
        try:
            await connection.serve()
        except (PeerGone, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the caller went away; nothing to answer
        except Exception:  # a bug here must cost one connection, never the server
            _log.exception("connection failed")
        finally:
            self._connections.discard(connection)
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)


class Connection:
    def __init__(self, server: H1Server, stream: trio.abc.Stream) -> None:
        self.server = server
        self.limits = server.limits
        self.stream = stream
        self.parser = RequestParser(self.limits.max_header_bytes)
        self._idle_scope: trio.CancelScope | None = None
        self.eof = False
        # Per request cycle.
        self.request_done = False  # its body was read to the end
        self.answered = False  # its answer was written
        self.continue_sent = False
        self.waited = False  # reading it had to wait for the caller's bytes

    def stop_if_idle(self) -> None:
        """Shutdown: a connection waiting for its next request closes now."""
        if self._idle_scope is not None:
            self._idle_scope.cancel()

    async def serve(self) -> None:
        while not self.server.stopping:
            request = await self._next_request()
            if request is None:
                return
            keep_alive = await self._answer(request)
            if self.server.after_answer is not None:
                self.server.after_answer()
            if not (keep_alive and self.answered and self.request_done):
                return
            if not self.waited:
                # The request was already buffered (pipelined): sr.sockio's reads and
                # writes are no checkpoints, so let other connections run before the next.
                await trio.lowlevel.checkpoint()
            self.request_done = self.answered = self.continue_sent = self.waited = False

    async def _next_request(self) -> RequestHead | None:
        """The next request head; None when the connection should just close (caller gone,
        idle too long, shutting down). Malformed or oversized heads are answered here."""
        self._idle_scope = trio.CancelScope(
            deadline=trio.current_time() + self.limits.keep_alive_timeout_s
        )
        event = None
        try:
            with self._idle_scope:
                event = await self.next_event()
        except RequestError as error:  # malformed (400) or too large (431)
            await self._refuse(error)
            return None
        finally:
            self._idle_scope = None
        if not isinstance(event, RequestHead):
            return None  # idle timeout, shutdown, or the caller closed
        return event

    async def _answer(self, request: RequestHead) -> bool:
        """Read the body, call the handler, write the answer. True if the connection may
        carry another request."""
        try:
            method = request.method.decode("ascii")
            raw_path, _, query = request.target.partition(b"?")
            path = unquote_to_bytes(raw_path).decode("utf-8")
        except UnicodeDecodeError:
            await self._refuse(InvalidRequest("request target is not valid UTF-8"))
            return False
        if self.server.adapter is not None:
            return await self.server.adapter.answer(self, request, method, path, raw_path, query)
        try:
            body = await self._read_body(request)
        except RequestError as error:  # malformed, too large, too slow
            await self._refuse(error)
            return False
        try:
            status, headers, payload = await self.server.handler(method, path, body)
        except Exception:
            _log.exception("handler failed on %s %s", method, path)
            error = RequestError("the worker failed to answer")
            status, headers, payload = error.status, [_JSON], error.body()
        head_only = request.method == b"HEAD"  # same head as GET, body never sent
        close = self.server.stopping or not request.keep_alive
        try:
            await self.send(status, headers, payload, close=close, head_only=head_only)
        except InvalidAnswer:
            _log.exception("handler gave an answer that cannot be written on %s %s", method, path)
            error = RequestError("the worker failed to answer")
            await self.send(error.status, [_JSON], error.body(), close=close)
        return not close

    async def _read_body(self, request: RequestHead) -> bytes:
        limit = self.limits.max_body_bytes
        for name, value in request.headers:
            if name == b"content-length" and int(value) > limit:  # llhttp checked the digits
                raise RequestTooLarge(f"request body exceeds {limit} bytes")
        await self.send_continue_if_awaited(request)
        chunks: list[bytes] = []
        size = 0
        with trio.move_on_after(self.limits.body_timeout_s):
            while True:
                event = await self.next_event()
                if event is END:
                    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
                if not isinstance(event, bytes):  # closed before the body was complete
                    raise PeerGone()
                size += len(event)
                if size > limit:
                    raise RequestTooLarge(f"request body exceeds {limit} bytes")
                chunks.append(event)
        raise BodyReadTimeout(f"request body not complete within {self.limits.body_timeout_s:g}s")

    def take_event(self):
        """The next parsed event without reading (NEED_DATA if none); RequestError for a
        request that cannot be parsed."""
        event = self.parser.next_event()
        if event is END:
            self.request_done = True
        return event

    async def next_event(self):
        while True:
            event = self.take_event()
            if event is not NEED_DATA:
                return event
            await self.receive_more()

    async def receive_more(self) -> None:
        """One read from the caller into the parser; PeerGone once it has closed."""
        if self.eof:
            raise PeerGone()
        data, waited = await sockio.receive_some_noting_wait(self.stream, READ_CHUNK)
        self.waited = self.waited or waited
        self.eof = not data
        self.parser.feed(data)

    async def _refuse(self, error: RequestError) -> None:
        """Answer a request that cannot be served (if the caller is still there), then the
        connection closes."""
        if self.eof:
            raise PeerGone()
        if not self.answered:
            await self.send(error.status, [_JSON], error.body(), close=True)
            await self.linger()

    async def send_continue_if_awaited(self, request: RequestHead) -> None:
        """`100 Continue` before waiting for a body the caller holds back for it."""
        if not request.expects_continue or self.continue_sent or self.answered:
            return
        if not self.parser.has_pending():  # none of the body has arrived yet
            self.continue_sent = True
            await sockio.send_all(self.stream, CONTINUE)

    async def send(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        *,
        close: bool,
        head_only: bool = False,
        length: int | None = None,
    ) -> None:
        """Write one whole answer (its head only for HEAD, where `length` may declare the
        size of the body a GET would get). InvalidAnswer, with nothing written, if the head
        cannot be written as given."""
        head = answer_head(status, headers, len(body) if length is None else length, close=close)
        self.answered = True
        await sockio.send_all(self.stream, head if head_only else head + body)

    async def linger(self) -> None:
        """After an early answer: stop writing, then drop what the caller still sends for a
        moment, so that closing does not reset the connection under its unread answer."""
        with trio.move_on_after(_LINGER_S):
            try:
                await self.stream.send_eof()
                while await self.stream.receive_some(READ_CHUNK):
                    pass
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass


async def open_listeners(
    *, uds: str | None = None, host: str = "127.0.0.1", port: int = 0
) -> tuple[list[trio.abc.Listener], list[str]]:
    """Listeners for a Unix socket path or a TCP host:port, and the names of what they bind
    (`unix:PATH`, `http://HOST:PORT`; IPv6 hosts in brackets)."""
    if uds is not None:
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        try:
            await sock.bind(uds)
            sock.listen(128)
        except BaseException:
            sock.close()
            raise
        return [trio.SocketListener(sock)], [f"unix:{uds}"]
    listeners = await trio.open_tcp_listeners(port, host=host)
    names = []
    for listener in listeners:
        bound_host, bound_port = listener.socket.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        names.append(f"http://{shown}:{bound_port}")
    return listeners, names
