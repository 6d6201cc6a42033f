"""A small HTTP/1.1 client for the router-to-worker hop: h11 over trio streams.

One `Http1Pool` per replica keeps idle connections alive and reuses them. It exists because
the general-purpose client (httpx) cost more per request than the hop itself on the
benchmark host (docs/benchmarks.md); this one sends a request's head and body in one write
and parses the answer with h11, nothing else.

Rules that keep errors honest:
* An idle connection the worker has closed (readable while idle: EOF or stray bytes) is
  dropped before use. If writing a request to a reused connection fails, nothing reached the
  worker's handler, so the request is written once more on a fresh connection. Once the
  request is written, any failure is final (the worker may have acted on it).
* Any error or cancellation in the middle of an exchange closes that connection; only a
  connection whose exchange completed cleanly goes back to the idle list.
* An answer larger than `max_response_bytes`, or one h11 cannot parse, is an
  `Http1Error` and costs the connection.
"""

from __future__ import annotations

import h11
import trio

DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_IDLE = 32
_READ_CHUNK = 65536
_CLOSED_EARLY = "worker closed the connection before a complete answer"


class Http1Error(Exception):
    """The exchange did not produce a complete HTTP answer."""


class _Connection:
    __slots__ = ("h11", "stream")

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)

    def close(self) -> None:
        # Synchronous on purpose: it must also run while the task is being cancelled.
        self.stream.socket.close()

    def idle_and_usable(self) -> bool:
        """An idle keep-alive connection is readable only if the peer closed it (or
        misbehaved); either way it must not carry another request."""
        return not self.stream.socket.is_readable()


class Http1Pool:
    def __init__(
        self,
        *,
        uds: str | None = None,
        host: str | None = None,
        port: int | None = None,
        max_idle: int = DEFAULT_MAX_IDLE,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        if (uds is None) == (host is None or port is None):
            raise ValueError("give either uds or host and port")
        self._uds = uds
        self._host = host
        self._port = port
        self._host_header = b"worker" if uds is not None else f"{host}:{port}".encode()
        self._idle: list[_Connection] = []
        self._max_idle = max_idle
        self._max_response_bytes = max_response_bytes
        self._closed = False
        self.connections_opened = 0  # for tests and benchmarks: reuse is observable

    async def request(
        self, method: str, path: str, body: bytes = b""
    ) -> tuple[int, dict[str, str], bytes]:
        if self._closed:
            raise Http1Error("client is closed")
        head = [(b"host", self._host_header)]
        if body or method == "POST":
            head.append((b"content-length", str(len(body)).encode()))
            if body:
                head.append((b"content-type", b"application/json"))
        conn, reused = await self._checkout()
        try:
            wire = conn.h11.send(h11.Request(method=method, target=path, headers=head))
            if body:
                wire += conn.h11.send(h11.Data(data=body))
            wire += conn.h11.send(h11.EndOfMessage())
            try:
                await conn.stream.send_all(wire)
            except (trio.BrokenResourceError, OSError) as error:
                if not reused:
                    raise Http1Error(f"send failed: {error!r}") from error
                conn.close()  # the worker closed it while idle: try once on a fresh one
                conn, reused = await self._checkout(fresh=True)
                wire = conn.h11.send(h11.Request(method=method, target=path, headers=head))
                if body:
                    wire += conn.h11.send(h11.Data(data=body))
                wire += conn.h11.send(h11.EndOfMessage())
                await conn.stream.send_all(wire)
            answer = await self._read_answer(conn)
        except BaseException as error:
            conn.close()
            if isinstance(error, trio.BrokenResourceError | OSError):
                raise Http1Error(f"{type(error).__name__}: {error}") from error
            if isinstance(error, h11.ProtocolError):
                raise Http1Error(f"malformed answer: {error}") from error
            raise
        self._checkin(conn)
        return answer

    async def _checkout(self, *, fresh: bool = False) -> tuple[_Connection, bool]:
        while self._idle and not fresh:
            conn = self._idle.pop()
            if conn.idle_and_usable():
                return conn, True
            conn.close()
        try:
            if self._uds is not None:
                stream = await trio.open_unix_socket(self._uds)
            else:
                stream = await trio.open_tcp_stream(self._host, self._port)
        except OSError as error:
            raise Http1Error(f"connect failed: {error!r}") from error
        self.connections_opened += 1
        return _Connection(stream), False

    def _checkin(self, conn: _Connection) -> None:
        state = conn.h11
        if (
            not self._closed
            and state.our_state is h11.DONE
            and state.their_state is h11.DONE
            and len(self._idle) < self._max_idle
        ):
            state.start_next_cycle()
            self._idle.append(conn)
        else:
            conn.close()

    async def _read_answer(self, conn: _Connection) -> tuple[int, dict[str, str], bytes]:
        status = 0
        headers: dict[str, str] = {}
        chunks: list[bytes] = []
        size = 0
        eof = False
        while True:
            try:
                event = conn.h11.next_event()
            except h11.RemoteProtocolError as error:
                if eof:  # h11 refuses an EOF in the middle of an answer
                    raise Http1Error(_CLOSED_EARLY) from error
                raise
            if event is h11.NEED_DATA:
                data = await conn.stream.receive_some(_READ_CHUNK)
                eof = not data
                conn.h11.receive_data(data)  # b"" marks EOF
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
                headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in event.headers}
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > self._max_response_bytes:
                    raise Http1Error(f"answer exceeds {self._max_response_bytes} bytes")
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                return status, headers, body
            elif isinstance(event, h11.ConnectionClosed):
                raise Http1Error(_CLOSED_EARLY)
            # InformationalResponse (1xx) and anything else: keep reading

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        await trio.lowlevel.checkpoint()
