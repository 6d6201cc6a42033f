"""One connection served under Trio: the loop between a socket and its sans-I/O
`sr.http.connection.ServerConnection`, for sr.http.server.

Per request cycle it reads bytes into the connection until a request head is complete (an
idle connection is closed by the server's sweep once `keep_alive_timeout_s` has passed; a
begun head must be complete within `head_timeout_s`, else 408), then hands the request to
the server's handler (its body read by sr.http.body within `max_body_bytes` and
`body_timeout_s`) or to its adapter, writes the answer the connection frames (within
`write_timeout_s`, else the caller is dropped), and starts the next cycle if the
connection's state allows. Refusals (400, 408, 413, 431, 505) are written with the
server's `error_answer`, then the connection lingers briefly and closes. A caller that
hangs up while the handler runs is noticed by the server's sr.http.hang_up poller: the
handler is cancelled and nothing is answered (PeerGone).

While it waits for its caller (the first or next head, the rest of a head or of a body, a
refused caller's last bytes) a connection notes since when it has made no progress
(`waiting_since`: accepted or answered for a head, the last bytes of a body, the refusal),
and at the connection cap the server reclaims the one waiting longest (`reclaim`): no
connection holds a slot by sending nothing, and a newcomer, whose head is there at once
and which is then served, is never the one chosen.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Protocol
from urllib.parse import unquote_to_bytes

import trio

from sr.answer import Answer, HeadFields
from sr.errors import HeadReadTimeout, InvalidRequest, RequestError
from sr.http import sockio
from sr.http.body import read_body
from sr.http.connection import END, NEED_DATA, ConnectionStateError, ServerConnection
from sr.http.hang_up import HangUpPoller
from sr.http.limits import HttpLimits
from sr.http.parse import RequestHead
from sr.http.wire import InvalidAnswer

# (method, path, body, the request's headers: lower-case names, in arrival order)
Handler = Callable[[str, str, bytes, HeadFields], Awaitable[Answer]]


class Adapter(Protocol):
    """What serves an app other than a plain handler (sr.http.asgi_adapter.AsgiAdapter):
    `answer` serves one request through the connection's public interface and says whether
    the connection may carry another."""

    async def lifespan(self, ended: Callable[[], Awaitable[None]], *, task_status) -> None: ...
    async def answer(
        self, connection: Connection, request: RequestHead, method: str, path: str
    ) -> bool: ...


class ServerContext(Protocol):
    """What a connection needs from the server that accepted it (sr.http.server.H1Server
    is one): its limits and hang-up poller, whether it is stopping, and what answers a
    request. The server hands each connection this much, not itself, so the two modules
    do not import each other."""

    limits: HttpLimits
    hang_ups: HangUpPoller
    stopping: bool
    handler: Handler | None
    adapter: Adapter | None
    after_answer: Callable[[], None] | None
    error_answer: Callable[[RequestError], Answer]
    crash_answer: Answer


_log = logging.getLogger("sr.http")
READ_CHUNK = 65536
# After an early answer (413, 408) the caller may still be sending; reading (and dropping)
# for a short while lets it see the answer instead of a reset connection.
_LINGER_S = 1.0
_ANSWERED_AT_ONCE = frozenset({"GET", "HEAD"})
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER on, zero seconds
_BODY_END = {"type": "http.request", "body": b"", "more_body": False}


def error_answer(error: RequestError) -> Answer:
    """sr's one error shape (sr.errors), for the router and the workers alike."""
    return error.answer()


class PeerGone(Exception):
    """The caller closed or reset the connection; nobody is left to answer."""


class Connection:
    """The Trio side of one connection: reads bytes into its `ServerConnection`
    (sr.http.connection, where the protocol state lives), acts on the events, writes what
    it returns, and keeps the time limits. Adapters use `http` (the request, its events),
    `stream`, `hang_ups`, `stopping` and the methods below; nothing else."""

    def __init__(self, server: ServerContext, stream: trio.abc.Stream) -> None:
        self._server = server
        self.limits = server.limits
        self.stream = stream
        self.hang_ups = server.hang_ups
        self.http = ServerConnection(self.limits.max_header_bytes, self.limits.max_body_bytes)
        # While it waits for a next request with no byte of it yet: when the server's
        # sweep closes it (Connection._next_request says why not a cancel scope).
        self.idle_until: float | None = None
        self._hang_up_scope = trio.CancelScope()  # Connection.serve's, for its whole life
        # While it waits for its caller: since when it has made no progress (module
        # docstring); None while its request is handled or answered. The connection cap
        # reclaims the one waiting longest (sr.http.server.longest_waiting).
        self.waiting_since: float | None = trio.current_time()
        self._waited = False  # reading this request cycle had to wait for the caller

    @property
    def stopping(self) -> bool:
        """The server is shutting down: answers close their connections."""
        return self._server.stopping

    def stop_if_idle(self) -> None:
        """Shutdown: a connection waiting for its next request, with no byte of it yet,
        closes now."""
        if self.idle_until is not None:
            self._close_idle()

    def reclaim(self, answer: Answer) -> None:
        """Room needed at the connection cap, for a connection waiting for its caller: it
        closes now, from the server's task, without waiting for anything. With no byte of
        a next request it closes quietly (as at shutdown); in the middle of a request it is
        answered `answer` (503) as far as the socket takes it at once, and its own task,
        waiting in a read, meets the closed socket (ClosedResourceError; for the ASGI app,
        `http.disconnect`)."""
        if self.idle_until is not None:
            self._close_idle()
            return
        self.waiting_since = None
        if type(self.stream) is not trio.SocketStream:  # not one sr's listeners make
            self._hang_up_scope.cancel()
            return
        sock = self.stream.socket
        try:
            if not self.http.answered:
                os.write(sock.fileno(), self.http.refusal(*answer))
            os.read(sock.fileno(), READ_CHUNK)  # drained once: a close then seldom resets
        except (OSError, ConnectionStateError):
            pass  # nothing more can be said at once; the close is what matters
        sock.close()  # wakes the connection's read with ClosedResourceError

    async def serve(self) -> None:
        # One scope for the connection's life, which the hang-up poller cancels when the
        # caller hangs up while the handler runs (_answer): the connection is over
        # then anyway, and a scope per request cost the worker 10-30 us
        # (docs/benchmarks-history.md).
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
        here (400/505, 431, 408).

        While no byte of a head is here the connection is idle: it carries no cancel scope
        of its own (one costs about 50,000 instructions a request), but notes `idle_until`,
        and the server's sweep closes it once that has passed (`close_if_idle`), as at
        shutdown or at the connection cap. A head's first byte starts the head's own time
        limit, under a scope: only a head split across reads pays for one."""
        http = self.http
        now = trio.current_time()
        self.waiting_since = now  # for the whole head: it must be in within head_timeout_s
        self.idle_until = now + self.limits.keep_alive_timeout_s
        try:
            while (event := http.next_event()) is NEED_DATA:
                if http.head_begun():
                    self.idle_until = None  # no longer idle: the head's time limit holds
                    event = await self._rest_of_head()
                    break
                await self.receive_more()
        except RequestError as error:  # malformed (400, 505) or too large (431)
            await self.refuse(error)
            return None
        finally:
            self.idle_until = self.waiting_since = None
        if not isinstance(event, RequestHead):
            return None  # shutdown, a 408 already answered, or the caller closed
        return event

    async def _rest_of_head(self) -> object:
        """The parser's next event once a head has begun, within `head_timeout_s` of now;
        None after answering 408."""
        timeout = self.limits.head_timeout_s
        with trio.move_on_after(timeout):
            while (event := self.http.next_event()) is NEED_DATA:
                await self.receive_more()
            return event
        await self.refuse(HeadReadTimeout(f"request head not complete within {timeout:g}s"))
        return None

    def close_if_idle(self, now: float) -> bool:
        """The server's sweep: an idle connection whose keep-alive time has passed closes
        (True)."""
        if self.idle_until is not None and self.idle_until <= now:
            self._close_idle()
            return True
        return False

    def _close_idle(self) -> None:
        """Close a connection waiting for its next request, with no byte of it yet: its
        socket is closed under its task's read, which meets ClosedResourceError (the
        connection ends quietly); a stream that is not a socket ends by its scope."""
        self.idle_until = self.waiting_since = None
        if type(self.stream) is trio.SocketStream:
            self.stream.socket.close()
        else:
            self._hang_up_scope.cancel()

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
            # A body of declared length within the cap that is already here whole (the usual
            # small JSON body, or none) is taken at once: no coroutine, no timer (about
            # 50,000 instructions of a worker's request, bench.bench_instructions).
            fits = 0 <= request.body_length <= self.limits.max_body_bytes
            if not fits or (body := self.http.take_complete_body()) is None:
                body = await read_body(
                    self._next_body_message, request.body_length,
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
        # request, about 10 us (docs/benchmarks-history.md).
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

    async def _next_body_message(self) -> dict:
        """sr.http.body's source for the handler path: the parser's body events, as the
        ASGI messages that reader takes."""
        http = self.http
        while True:
            event = http.next_event()
            if type(event) is bytes:
                return {"body": event, "more_body": True, "type": "http.request"}
            if event is END:
                return _BODY_END
            if event is not NEED_DATA:  # closed before the body was complete
                raise PeerGone()
            await self.send_continue_if_awaited()  # about to wait for the body
            await self.receive_more_body()

    async def receive_more(self) -> None:
        """One read from the caller into the connection; PeerGone once it has closed."""
        if self.http.caller_closed:
            raise PeerGone()
        data, waited = await sockio.receive_some_noting_wait(self.stream, READ_CHUNK)
        self._waited = self._waited or waited
        self.http.receive_data(data)

    async def receive_more_body(self) -> None:
        """`receive_more` for a request body, reclaimable at the connection cap while it
        waits: it has made no progress since the bytes before (or its head). A read that
        waits is not the common path (a small body comes with its head), so the clock
        read costs no request that does not wait anyway."""
        self.waiting_since = trio.current_time()
        try:
            await self.receive_more()
        finally:
            self.waiting_since = None

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
        data = self.http.answer(status, headers, body, length=length, close=self._server.stopping)
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
        moment, so that closing does not reset the connection under its unread answer.
        Reclaimable at the connection cap: nothing more is owed to the caller."""
        self.waiting_since = trio.current_time()
        with trio.move_on_after(_LINGER_S):
            try:
                await self.stream.send_eof()
                while await self.stream.receive_some(READ_CHUNK):
                    pass
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
