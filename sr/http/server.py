"""sr's HTTP/1.1 server over trio streams, for the worker and the router's front end.

It exists because hypercorn cost about half a millisecond of CPU per request (bench/
narrative.md): on the worker that CPU competes with the model's forwards, on the router it
was most of the hop's overhead. The worker's handler is called directly,
`handler(method, path, body, headers)`; the router's front end is an ASGI app, served through
`adapter=sr.http.asgi_adapter.AsgiAdapter(app)` (streamed body, `http.disconnect` when the caller
hangs up, lifespan).
Only what the router, its workers and direct callers need is here (no HTTP/2, no TLS):

* the protocol's state (what may be read, answered, kept alive) is sr.http.connection's, a
  state machine without I/O over llhttp (sr.http.parse) and the answer writer (sr.http.wire,
  framing by sr.http.framing); this module is the Trio loop around it: read bytes, feed the
  connection, act on its events, write what it returns, keep the time limits. Socket reads
  and writes are sr.http.sockio's (a checkpoint only when waiting);
* keep-alive, one request at a time per connection; pipelined requests are answered in
  order (what arrives early waits in the parser; while a request is served nothing more
  is read);
* Content-Length and chunked request bodies, capped in size (413, from the declared
  length and while reading) and in time (408 when the body is not complete in time);
* every limit of sr.http.limits.HttpLimits: a head must arrive within `head_timeout_s` of
  its first byte (else 408), an idle kept-alive connection closes after
  `keep_alive_timeout_s`, an answer the caller does not read within `write_timeout_s`
  costs it the connection, and each listener holds at most `max_connections` (beyond it
  the longest-idle connection is closed to make room, or the newcomer gets 503);
* malformed requests answered 400 (505 for an HTTP version other than 1.0 and 1.1) and
  the connection closed; error bodies are the caller's (`error_answer`, by default sr's one
  error shape from sr.errors), and so is the answer when the handler fails (`crash_answer`);
* a caller that hangs up (or half-closes: the same on the wire) while its request is
  served is noticed by one poller per server (sr.http.hang_up): the work is cancelled and
  nothing is answered, for the worker's handler and the router's app alike;
* graceful shutdown: stop accepting, close idle connections, let requests in flight finish
  within a grace period, then cancel what is left.

Any answer given before the request body was read in full closes the connection afterwards,
since the rest of that body cannot be told apart from a next request.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import socket
import struct
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol
from urllib.parse import unquote_to_bytes

import trio

from sr.errors import HeadReadTimeout, InvalidRequest, Overloaded, RequestError
from sr.http import hang_up, sockio
from sr.http.body import read_body
from sr.http.connection import END, NEED_DATA, ServerConnection
from sr.http.limits import HttpLimits
from sr.http.parse import RequestHead
from sr.http.wire import InvalidAnswer

Response = tuple[int, list[tuple[bytes, bytes]], bytes]
# (method, path, body, the request's headers: lower-case names, in arrival order)
Handler = Callable[[str, str, bytes, list[tuple[bytes, bytes]]], Awaitable[Response]]


class Adapter(Protocol):
    """What serves an app other than a plain handler (sr.http.asgi_adapter.AsgiAdapter):
    `answer` serves one request through the connection's public interface and says whether
    the connection may carry another."""

    async def lifespan(self, ended: Callable[[], Awaitable[None]], *, task_status) -> None: ...
    async def answer(
        self, connection: Connection, request: RequestHead, method: str, path: str
    ) -> bool: ...


def error_answer(error: RequestError) -> Response:
    """sr's one error shape (sr.errors), for the router and the workers alike."""
    extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in error.headers.items()]
    return error.status, [_JSON, *extra], error.body()


_log = logging.getLogger("sr.http")
READ_CHUNK = 65536
_JSON = (b"content-type", b"application/json")
# After an early answer (413, 408) the caller may still be sending; reading (and dropping)
# for a short while lets it see the answer instead of a reset connection.
_LINGER_S = 1.0
# accept() failures that mean "out of resources for now", not "listener broken".
_ACCEPT_RETRY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
_DEFAULT_LIMITS = HttpLimits()
_ANSWERED_AT_ONCE = frozenset({"GET", "HEAD"})
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER on, zero seconds
# Descriptors kept out of the connection budget: worker sockets, pipes, logs, listeners.
_RESERVED_FDS = 64


class PeerGone(Exception):
    """The caller closed or reset the connection; nobody is left to answer."""


class H1Server:
    """Serves `handler(method, path, body, headers) -> (status, headers, body)`, or an app through
    an adapter (`adapter=sr.http.asgi_adapter.AsgiAdapter(app)`, with its lifespan), on trio
    listeners.

    `after_answer()` runs once each answer has been written (the worker's `exit` fault).
    With an adapter the app enforces its own body caps; `limits.max_body_bytes` and
    `body_timeout_s` apply to `handler` only. `error_answer(error)` makes the answer to a
    request refused here (400, 408, 413, 431, 503, 505); `crash_answer` is the answer when
    the handler raises or gives an answer that cannot be written.
    """

    def __init__(
        self,
        handler: Handler | None = None,
        limits: HttpLimits = _DEFAULT_LIMITS,
        *,
        adapter: Adapter | None = None,
        after_answer: Callable[[], None] | None = None,
        hang_up_interval_s: float = hang_up.DEFAULT_INTERVAL_S,
        error_answer: Callable[[RequestError], Response] = error_answer,
        crash_answer: Response | None = None,
    ) -> None:
        if (handler is None) == (adapter is None):
            raise ValueError("H1Server serves exactly one of handler or adapter")
        self.handler = handler
        self.adapter = adapter
        self.limits = limits
        self.after_answer = after_answer
        self.error_answer = error_answer
        self.crash_answer = crash_answer or error_answer(
            RequestError("the server failed to answer")
        )
        self.hang_ups = hang_up.HangUpPoller(hang_up_interval_s)
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
        cap = connection_cap(self.limits.max_connections, len(listeners))
        async with trio.open_nursery() as poller:
            poller.start_soon(self.hang_ups.run)
            async with trio.open_nursery() as lifespan:
                lifespan_ended = trio.Event()
                if self.adapter is not None:
                    await lifespan.start(self.adapter.lifespan, lifespan_ended.wait)
                await self._serve_until(listeners, shutdown_trigger, cap, task_status)
                lifespan_ended.set()  # the app's lifespan shutdown runs to its end
            poller.cancel_scope.cancel()

    async def _serve_until(self, listeners, shutdown_trigger, cap: int, task_status) -> None:
        async with trio.open_nursery() as connections:
            async with trio.open_nursery() as accepting:
                for listener in listeners:
                    accepting.start_soon(self._accept_loop, listener, connections, cap)
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

    async def _accept_loop(
        self, listener: trio.abc.Listener, nursery: trio.Nursery, cap: int
    ) -> None:
        """Accept for ever, holding at most `cap` connections from this listener."""
        held: set[Connection] = set()
        while True:
            try:
                stream = await listener.accept()
            except OSError as error:
                if error.errno not in _ACCEPT_RETRY_ERRNOS:
                    raise
                _log.warning("accept failed (%s); retrying shortly", error)
                await trio.sleep(0.1)
                continue
            if len(held) >= cap and not _close_longest_idle(held):
                await _turn_away(stream, self.error_answer(_TOO_MANY))
                continue
            connection = Connection(self, stream)
            held.add(connection)
            nursery.start_soon(self._serve_connection, connection, held)

    async def _serve_connection(self, connection: Connection, held: set[Connection]) -> None:
        self._connections.add(connection)
        try:
            await connection.serve()
        except (PeerGone, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the caller went away, or would not read; nothing to answer
        except Exception:  # a bug here must cost one connection, never the server
            _log.exception("connection failed")
        finally:
            self._connections.discard(connection)
            held.discard(connection)
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(connection.stream)

    def open_connections(self) -> int:
        return len(self._connections)


def connection_cap(max_connections: int, listeners: int) -> int:
    """Connections per listener: `max_connections`, lowered so that every listener at its
    cap still fits the process's descriptor limit (never an EMFILE loop at the cap)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    fits = max(1, (soft - _RESERVED_FDS) // max(1, listeners))
    if fits < max_connections:
        _log.warning(
            "max_connections lowered from %d to %d per listener: the descriptor limit is %d",
            max_connections, fits, soft,
        )  # fmt: skip
    return min(max_connections, fits)


def _close_longest_idle(held: set[Connection]) -> bool:
    """Make room at the cap: close the connection idle the longest (a kept-alive one with
    no byte of a next request). False when none is idle."""
    idle = [c for c in held if c.idle_since is not None]
    if not idle:
        return False
    oldest = min(idle, key=lambda c: c.idle_since)
    oldest.stop_if_idle()
    held.discard(oldest)  # counted out now; its task closes it at once
    return True


_TOO_MANY = Overloaded("too many open connections; retry shortly")


async def _turn_away(stream: trio.abc.Stream, answer: Response) -> None:
    """503 to a connection over the cap, without reading its request, then close. A fresh
    connection's send buffer is empty, so the write never waits; what the caller already
    sent is drained once (without waiting) so that closing does not reset the connection
    under its answer."""
    data = ServerConnection(0).refusal(*answer)  # no request is read: a bare refusal
    try:
        with trio.move_on_after(0.1):
            await sockio.send_all(stream, data)
        if isinstance(stream, trio.SocketStream):
            os.read(stream.socket.fileno(), READ_CHUNK)
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    await trio.aclose_forcefully(stream)


class Connection:
    """The Trio side of one connection: reads bytes into its `ServerConnection`
    (sr.http.connection, where the protocol state lives), acts on the events, writes what
    it returns, and keeps the time limits. Adapters use `http` (the request, its events),
    `stream`, `hang_ups`, `stopping` and the methods below; nothing else."""

    def __init__(self, server: H1Server, stream: trio.abc.Stream) -> None:
        self._server = server
        self.limits = server.limits
        self.stream = stream
        self.hang_ups = server.hang_ups
        self.http = ServerConnection(self.limits.max_header_bytes)
        self._idle_scope: trio.CancelScope | None = None
        self._hang_up_scope = trio.CancelScope()  # Connection.serve's, for its whole life
        # Since when it has waited for a next request with no byte of it yet; None while
        # a request is read or served. The connection cap closes the longest idle first.
        self.idle_since: float | None = None
        self._waited = False  # reading this request cycle had to wait for the caller

    @property
    def stopping(self) -> bool:
        """The server is shutting down: answers close their connections."""
        return self._server.stopping

    def stop_if_idle(self) -> None:
        """Shutdown, or room needed at the connection cap: a connection waiting for its
        next request, with no byte of it yet, closes now."""
        if self._idle_scope is not None:
            self._idle_scope.cancel()

    async def serve(self) -> None:
        # One scope for the connection's life, which the hang-up poller cancels when the
        # caller hangs up while the handler runs (_call_handler): the connection is over
        # then anyway, and a scope per request cost the worker 10-30 us (bench/narrative.md).
        with trio.CancelScope() as self._hang_up_scope:
            await self._serve_requests()
        if self._hang_up_scope.cancelled_caught:
            raise PeerGone()

    async def _serve_requests(self) -> None:
        server = self._server
        http = self.http
        while not server.stopping:
            request = await self._next_request()
            if request is None:
                return
            keep_alive = await self._answer(request)
            if server.after_answer is not None:
                server.after_answer()
            if not (keep_alive and http.keep_alive):
                return
            if not self._waited:
                # The request was already buffered (pipelined): sr.http.sockio's reads and
                # writes are no checkpoints, so let other connections run before the next.
                await trio.lowlevel.checkpoint()
            http.start_next_cycle()
            self._waited = False

    async def _next_request(self) -> RequestHead | None:
        """The next request head; None when the connection should just close (caller gone,
        idle too long, shutting down). Malformed, oversized and too slow heads are answered
        here (400/505, 431, 408)."""
        http = self.http
        now = trio.current_time()
        waiting = trio.CancelScope(deadline=now + self.limits.keep_alive_timeout_s)
        self._idle_scope = waiting
        self.idle_since = now
        event = None
        try:
            with waiting:
                while (event := http.next_event()) is NEED_DATA:
                    if self._idle_scope is not None and http.head_begun():
                        # A head's first byte is here: no longer idle, and the rest of
                        # the head must follow within the head timeout.
                        self._idle_scope = self.idle_since = None
                        waiting.deadline = trio.current_time() + self.limits.head_timeout_s
                    await self.receive_more()
        except RequestError as error:  # malformed (400, 505) or too large (431)
            await self.refuse(error)
            return None
        finally:
            self._idle_scope = self.idle_since = None
        if waiting.cancelled_caught and http.head_begun():
            timeout = self.limits.head_timeout_s
            await self.refuse(HeadReadTimeout(f"request head not complete within {timeout:g}s"))
            return None
        if not isinstance(event, RequestHead):
            return None  # idle timeout, shutdown, room at the cap, or the caller closed
        return event

    async def _answer(self, request: RequestHead) -> bool:
        """Read the body, call the handler (or the adapter), write the answer. False if the
        adapter wants the connection closed (whatever the protocol state allows)."""
        try:
            method = request.method.decode("ascii")
            path = unquote_to_bytes(request.raw_path).decode("utf-8")
        except UnicodeDecodeError:
            await self.refuse(InvalidRequest("request target is not valid UTF-8"))
            return False
        server = self._server
        if server.adapter is not None:
            return await server.adapter.answer(self, request, method, path)
        try:
            body = await read_body(
                self._next_body_chunk, request.body_length,
                self.limits.max_body_bytes, self.limits.body_timeout_s,
            )  # fmt: skip
        except RequestError as error:  # malformed, too large, too slow
            await self.refuse(error)
            return False
        # The caller may hang up (or half-close) while the handler runs: the server's
        # poller then cancels the connection's scope, the handler is cancelled, and the
        # connection ends without an answer, as the router's front end cancels a dispatch.
        # The worker's GET routes (health, card, metrics) answer without waiting, so there
        # is nothing to cancel: not watching them saves /health, the pool's most frequent
        # request, about 10 us (bench/narrative.md).
        watched = type(self.stream) is trio.SocketStream and method not in _ANSWERED_AT_ONCE
        if watched:
            self.hang_ups.watch(self, self.stream.socket.fileno(), self._hang_up_scope.cancel)
        try:
            status, headers, payload = await server.handler(method, path, body, request.headers)
        except Exception:
            _log.exception("handler failed on %s %s", method, path)
            status, headers, payload = server.crash_answer
        finally:
            if watched:
                self.hang_ups.unwatch(self)
        if watched and self._hang_up_scope.cancel_called:
            # A handler that returned before it noticed is not answered either: sr.http.sockio's
            # writes are no cancel points.
            raise PeerGone()
        try:
            await self.send_answer(status, headers, payload)
        except InvalidAnswer:
            _log.exception("handler gave an answer that cannot be written on %s %s", method, path)
            await self.send_answer(*server.crash_answer)
        return True

    async def _next_body_chunk(self) -> tuple[bytes, bool]:
        """sr.http.body's source for the handler path: the parser's body events."""
        http = self.http
        while True:
            event = http.next_event()
            if type(event) is bytes:
                return event, True
            if event is END:
                return b"", False
            if event is not NEED_DATA:  # closed before the body was complete
                raise PeerGone()
            await self.send_continue_if_awaited()  # about to wait for the body
            await self.receive_more()

    async def receive_more(self) -> None:
        """One read from the caller into the connection; PeerGone once it has closed."""
        if self.http.caller_closed:
            raise PeerGone()
        data, waited = await sockio.receive_some_noting_wait(self.stream, READ_CHUNK)
        self._waited = self._waited or waited
        self.http.receive_data(data)

    async def refuse(self, error: RequestError) -> None:
        """Answer a request that cannot be served (if the caller is still there and nothing
        was answered yet), then the connection closes."""
        if self.http.caller_closed:
            raise PeerGone()
        if not self.http.answered:
            await self._write(self.http.refusal(*self._server.error_answer(error)))
            await self.linger()

    async def send_continue_if_awaited(self) -> None:
        """`100 Continue` before waiting for a body the caller holds back for it."""
        data = self.http.continue_bytes()
        if data is not None:
            await self._write(data)

    async def send_answer(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        length: int | None = None,
    ) -> None:
        """Write the answer to the current request, whole (sr.http.connection frames it);
        it closes the connection while the server shuts down. InvalidAnswer, with nothing
        written, if the head cannot be written as given."""
        data = self.http.answer(status, headers, body, length=length, close=self.stopping)
        await self._write(data)

    async def _write(self, data: bytes) -> None:
        """All of `data` within the write timeout; BrokenResourceError (the connection is
        dropped) for a caller that does not read."""
        timeout = self.limits.write_timeout_s
        try:
            await sockio.send_all(self.stream, data, timeout)
        except sockio.SendTimeout:
            if isinstance(self.stream, trio.SocketStream):
                # Close with a reset: a plain close would leave the unsent answer in the
                # kernel, retried for minutes towards a caller that reads nothing.
                sock = self.stream.socket
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
            raise trio.BrokenResourceError(
                f"the caller did not read its answer within {timeout:g}s"
            ) from None

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
