"""sr's HTTP/1.1 server over trio streams, for the worker and the router's front end.

It exists because hypercorn cost about half a millisecond of CPU per request
(docs/benchmarks-history.md): on the worker that CPU competes with the model's forwards,
on the router it was most of the hop's overhead. The worker's handler is called directly,
`handler(method, path, body, headers)`; the router's front end is an ASGI app, served through
`adapter=sr.http.asgi_adapter.AsgiAdapter(app)` (streamed body, `http.disconnect` when the caller
hangs up, lifespan).
Only what the router, its workers and direct callers need is here (no HTTP/2, no TLS):

* the protocol's state (what may be read, answered, kept alive) is sr.http.connection's, a
  state machine without I/O over llhttp (sr.http.parse) and the answer writer (sr.http.wire,
  framing by sr.http.framing); this module is the Trio loop around it: read bytes, feed the
  connection, act on its events, write what it returns, keep the time limits: one task per
  connection (sr.http.driver), accepted here. Socket reads and writes are sr.http.sockio's
  (a checkpoint only when waiting);
* keep-alive, one request at a time per connection; pipelined requests are answered in
  order (what arrives early waits in the parser; while a request is served nothing more
  is read);
* Content-Length and chunked request bodies, capped in size (413, from the declared
  length, from each chunk's announced size, and while reading) and in time (408 when
  the body is not complete in time);
* every limit of sr.http.limits.HttpLimits: a head must arrive within `head_timeout_s` of
  its first byte (else 408), an idle kept-alive connection closes after
  `keep_alive_timeout_s` (swept every eighth of it, at most a second apart), an answer the
  caller does not read within `write_timeout_s` costs it the connection, and each listener
  holds at most `max_connections`: beyond it the connection that has waited longest for
  its caller without progress is closed to make room (`longest_waiting`), and only when
  every connection is being served does the newcomer get 503;
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
import math
import os
import resource
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Protocol, TypeVar

import trio

from sr.answer import Answer
from sr.errors import Overloaded, RequestError
from sr.http import hang_up, sockio
from sr.http.connection import ServerConnection
from sr.http.driver import (
    READ_CHUNK,
    Adapter,
    Connection,
    Handler,
    PeerGone,
    error_answer,
)
from sr.http.limits import HttpLimits

__all__ = ["Adapter", "H1Server", "Handler", "error_answer", "open_listeners"]

_log = logging.getLogger("sr.http")
# accept() failures that mean "out of resources for now", not "listener broken".
_ACCEPT_RETRY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
_DEFAULT_LIMITS = HttpLimits()
_IDLE_SWEEP_MAX_S = 1.0  # the longest between two sweeps for idle connections
# Descriptors kept out of the connection budget: worker sockets, pipes, logs, listeners.
_RESERVED_FDS = 64


class H1Server:
    """Serves `handler(method, path, body, headers) -> (status, headers, body)`, or an app through
    an adapter (`adapter=sr.http.asgi_adapter.AsgiAdapter(app)`, with its lifespan), on trio
    listeners.

    `after_answer()` runs once each answer has been written (the worker's `exit` fault).
    With an adapter the app enforces its own body caps; `limits.max_body_bytes` and
    `body_timeout_s` apply to `handler` only, except that on both a chunk announced over
    `max_body_bytes` is refused (413) as soon as its size line is in (sr.http.parse).
    `error_answer(error)` makes the answer to a request refused here (400, 408, 413, 431,
    503, 505); `crash_answer` is the answer when the handler raises or gives an answer that
    cannot be written.
    """

    def __init__(
        self,
        handler: Handler | None = None,
        limits: HttpLimits = _DEFAULT_LIMITS,
        *,
        adapter: Adapter | None = None,
        after_answer: Callable[[], None] | None = None,
        hang_up_interval_s: float = hang_up.DEFAULT_INTERVAL_S,
        error_answer: Callable[[RequestError], Answer] = error_answer,
        crash_answer: Answer | None = None,
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
            poller.start_soon(self._close_idle_connections)
            async with trio.open_nursery() as lifespan:
                lifespan_ended = trio.Event()
                if self.adapter is not None:
                    await lifespan.start(self.adapter.lifespan, lifespan_ended.wait)
                await self._serve_until(listeners, shutdown_trigger, cap, task_status)
                lifespan_ended.set()  # the app's lifespan shutdown runs to its end
            poller.cancel_scope.cancel()

    async def _close_idle_connections(self) -> None:
        """The keep-alive timeout, for every connection at once: a sweep every eighth of
        it (at most a second apart) closes the connections idle past it, so an idle
        connection closes within an eighth of the timeout after it, and a request pays
        no timer of its own (sr.http.driver.Connection._next_request)."""
        interval = min(self.limits.keep_alive_timeout_s / 8, _IDLE_SWEEP_MAX_S)
        while True:
            await trio.sleep(interval)
            now = trio.current_time()
            for connection in list(self._connections):
                if connection.close_if_idle(now):
                    self._connections.discard(connection)  # counted out at once

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
            if len(held) >= cap and not self._make_room(held):
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

    def _make_room(self, held: set[Connection]) -> bool:
        """At the cap: reclaim the connection waiting longest for its caller (counted out
        at once; its socket is closed now or, when idle, by its task). False when every
        connection is being served."""
        oldest = longest_waiting(held)
        if oldest is None:
            return False
        held.discard(oldest)
        oldest.reclaim(self.error_answer(_TOO_MANY))
        return True

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


class Waiting(Protocol):
    waiting_since: float | None


W = TypeVar("W", bound=Waiting)


def longest_waiting(connections: Iterable[W]) -> W | None:
    """The connection to reclaim at the cap: of those waiting for their caller (a next
    head, the rest of a head or body, a refused caller's last bytes: `waiting_since` is
    set), the one that has gone longest without progress. None when every connection is
    being served (its request handled or answered): those are never cut for a newcomer.

    Why this one: it is what a flood of begun heads or trickled bodies is made of, and it
    can never be a newcomer, which is the youngest and, once its head is in, being served;
    so a probe (/health, /ready) is served at the cap whatever holds the other slots."""
    chosen, oldest = None, math.inf
    for connection in connections:
        since = connection.waiting_since
        if since is not None and since < oldest:
            chosen, oldest = connection, since
    return chosen


_TOO_MANY = Overloaded("too many open connections; retry shortly")


async def _turn_away(stream: trio.abc.Stream, answer: Answer) -> None:
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
