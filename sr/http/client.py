"""A small HTTP/1.1 client for the router-to-worker hop, over trio streams.

One `Http1Pool` per replica keeps idle connections alive and reuses them. It exists because
general-purpose clients cost more per request than the hop itself (docs/benchmarks.md). It
only ever talks to `sr.http.server` (managed workers), whose every answer declares
Content-Length, so it speaks a strict subset of HTTP/1.1: the request head is built as
bytes and written with its body in one `send_all`; the answer is a status line, header lines
up to the blank line (at most `MAX_HEAD_BYTES`), a mandatory Content-Length and exactly that
many body bytes. Chunked or length-less answers, bad header lines and oversized heads are
refused as malformed (a `ReadFailed`, never a hang).

Rules that keep errors honest:
* Every failure is a `sr.errors.TransportError` of the phase it happened in: ConnectFailed,
  WriteFailed (the request was not written whole, so no handler saw it) or ReadFailed (it
  was written; the worker may have acted on it). Nothing above re-wraps them.
* An idle connection the worker has closed (readable while idle: EOF or stray bytes) is
  dropped before use. A WriteFailed on a reused connection (the worker closed it as it was
  reused) is written once more on a fresh connection; any other failure is final.
* Any error or cancellation in the middle of an exchange closes that connection; only a
  connection whose exchange completed cleanly (and that the worker did not mark
  `connection: close`, and that carried no bytes past the answer) goes back to the idle list.
* An answer larger than `max_response_bytes`, or a malformed one, is a `ReadFailed` and
  costs the connection.
"""

from __future__ import annotations

import re

import trio

from sr.errors import ConnectFailed, ReadFailed, WriteFailed
from sr.http import sockio
from sr.http.hop import NO_HOP, Hop

DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_IDLE = 32
MAX_HEAD_BYTES = 16384  # the same bound the server puts on a request head
_READ_CHUNK = 65536
_CLOSED_EARLY = "worker closed the connection before a complete answer"
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([1-9][0-9][0-9])(?: [^\r\n]*)?")
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Every header line of an answer, each after its CRLF: `token: value` with no CR, LF or NUL
# in the value. One match checks the whole block (a worker's answer has about ten lines:
# a match per line cost about 10k instructions per answer); a block that fails is then
# walked line by line only to name the bad line.
_HEADER_LINES = re.compile(rb"(?:\r\n[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[^\r\n\0]*)*")
_TARGET = re.compile(r"[!-~]+")  # visible ASCII: no spaces, CR, LF or controls
_NO_BODY_STATUS = (204, 304)
_HEAD_CACHE_SIZE = 64


class _Connection:
    __slots__ = ("stream",)

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream

    def close(self) -> None:
        # Synchronous on purpose: it must also run while the task is being cancelled.
        self.stream.socket.close()

    def idle_and_usable(self) -> bool:
        """An idle keep-alive connection is readable only if the peer closed it (or
        misbehaved); either way it must not carry another request."""
        return not self.stream.socket.is_readable()


class Http1Pool:
    """Kept-alive connections to one worker's Unix socket `uds`."""

    def __init__(
        self,
        *,
        uds: str,
        max_idle: int = DEFAULT_MAX_IDLE,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        self._uds = uds
        self._host_header = b"worker"
        self._heads: dict[tuple[str, str], bytes] = {}  # request-line + host, per route
        self._idle: list[_Connection] = []
        self._max_idle = max_idle
        self._max_response_bytes = max_response_bytes
        self._closed = False
        self.connections_opened = 0  # for tests and benchmarks: reuse is observable

    async def request(
        self, method: str, path: str, body: bytes = b"", hop: Hop = NO_HOP
    ) -> tuple[int, dict[str, str], bytes]:
        """One exchange; each field `hop` sets travels as its header (sr.http.hop)."""
        if self._closed:
            raise ConnectFailed("client is closed")
        wire = self._request_bytes(method, path, body, hop)
        conn, reused = await self._checkout()
        try:
            # sockio's calls are no cancel points: a dispatch cancelled by now (its caller
            # hung up) must not reach a worker.
            await trio.lowlevel.checkpoint_if_cancelled()
            try:
                await _send(conn, wire)
            except WriteFailed:
                if not reused:
                    raise
                conn.close()  # the worker closed it while idle: try once on a fresh one
                conn, reused = await self._checkout(fresh=True)
                await _send(conn, wire)
            status, headers, body, keep = await self._read_answer(conn, method == "HEAD")
        except BaseException as error:
            conn.close()
            if isinstance(error, trio.BrokenResourceError | OSError):  # reading the answer
                raise ReadFailed(f"{type(error).__name__}: {error}") from error
            raise
        if keep and not self._closed and len(self._idle) < self._max_idle:
            self._idle.append(conn)
        else:
            conn.close()
        return status, headers, body

    # The name the pool's transports answer to (sr.pool.transport.Transport).
    exchange = request

    def _request_bytes(self, method: str, path: str, body: bytes, hop: Hop = NO_HOP) -> bytes:
        prefix = self._heads.get((method, path))
        if prefix is None:
            if not _TOKEN.fullmatch(method.encode("ascii", "replace")):
                raise WriteFailed(f"invalid method {method!r}")
            if not _TARGET.fullmatch(path):
                raise WriteFailed(f"invalid request target {path!r}")
            prefix = b"%s %s HTTP/1.1\r\nhost: %s\r\n" % (
                method.encode(), path.encode(), self._host_header)  # fmt: skip
            if len(self._heads) < _HEAD_CACHE_SIZE:
                self._heads[(method, path)] = prefix
        request_id, deployment, traceparent = hop
        if request_id is not None:
            prefix = b"%sx-request-id: %s\r\n" % (prefix, request_id.encode("ascii"))
        if deployment is not None:
            prefix = b"%sx-sr-deployment: %s\r\n" % (prefix, deployment.encode("ascii"))
        if traceparent is not None:
            prefix = b"%straceparent: %s\r\n" % (prefix, traceparent.encode("ascii"))
        if body:
            return b"%scontent-length: %d\r\ncontent-type: application/json\r\n\r\n%s" % (
                prefix, len(body), body)  # fmt: skip
        if method == "POST":
            return prefix + b"content-length: 0\r\n\r\n"
        return prefix + b"\r\n"

    async def _checkout(self, *, fresh: bool = False) -> tuple[_Connection, bool]:
        while self._idle and not fresh:
            conn = self._idle.pop()
            if conn.idle_and_usable():
                return conn, True
            conn.close()
        try:
            stream = await self._open_stream()
        except OSError as error:
            raise ConnectFailed(f"connect failed: {error!r}") from error
        self.connections_opened += 1
        return _Connection(stream), False

    async def _open_stream(self) -> trio.SocketStream:
        return await trio.open_unix_socket(self._uds)

    async def _read_answer(
        self, conn: _Connection, head_request: bool
    ) -> tuple[int, dict[str, str], bytes, bool]:
        """(status, headers, body, keep-alive) of the next final answer on `conn`."""
        stream = conn.stream
        data = b""
        while True:  # one pass per answer head; 1xx heads are skipped
            end = data.find(b"\r\n\r\n")
            while end < 0:
                if len(data) > MAX_HEAD_BYTES:
                    raise ReadFailed(f"malformed answer: head exceeds {MAX_HEAD_BYTES} bytes")
                chunk = await sockio.receive_some(stream, _READ_CHUNK)
                if not chunk:
                    raise ReadFailed(_CLOSED_EARLY)
                searched = max(0, len(data) - 3)
                data += chunk
                end = data.find(b"\r\n\r\n", searched)
            if end > MAX_HEAD_BYTES:
                raise ReadFailed(f"malformed answer: head exceeds {MAX_HEAD_BYTES} bytes")
            status, headers, length, keep = parse_head(data[:end])
            data = data[end + 4 :]
            if status >= 200:
                break
        if head_request or status in _NO_BODY_STATUS:
            length = 0
        elif length is None:
            raise ReadFailed("malformed answer: no content-length")
        if length > self._max_response_bytes:
            raise ReadFailed(f"answer exceeds {self._max_response_bytes} bytes")
        if len(data) < length:
            chunks = [data]
            have = len(data)
            while have < length:
                chunk = await sockio.receive_some(
                    stream, max(_READ_CHUNK, min(length - have, 1 << 20))
                )
                if not chunk:
                    raise ReadFailed(_CLOSED_EARLY)
                chunks.append(chunk)
                have += len(chunk)
            data = b"".join(chunks)
        if len(data) > length:  # bytes past the answer: answer is whole, connection is not
            return status, headers, data[:length], False
        return status, headers, data, keep

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        await trio.lowlevel.checkpoint()


def parse_head(head: bytes) -> tuple[int, dict[str, str], int | None, bool]:
    """Status line and header lines (no trailing blank line) -> (status, headers with
    lower-case names, content-length or None, keep-alive). Raises ReadFailed."""
    lines = head.split(b"\r\n")
    match = _STATUS_LINE.fullmatch(lines[0])
    if match is None:
        raise ReadFailed(f"malformed answer: status line {lines[0][:80]!r}")
    keep = match.group(1) == b"1"  # an HTTP/1.0 answer is not kept
    if not _HEADER_LINES.fullmatch(head, len(lines[0])):
        raise ReadFailed(f"malformed answer: {_bad_line(lines[1:])}")
    headers: dict[str, str] = {}
    length: int | None = None
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        value = value.strip(b" \t")
        key = name.lower().decode("ascii")
        text = value.decode("latin-1")
        if key == "content-length":
            if not value.isdigit() or len(value) > 18:
                raise ReadFailed(f"malformed answer: content-length {text[:40]!r}")
            if length is not None and int(value) != length:
                raise ReadFailed("malformed answer: conflicting content-length")
            length = int(value)
        elif key == "transfer-encoding":
            raise ReadFailed(f"malformed answer: transfer-encoding {text[:40]!r} unsupported")
        elif key == "connection" and "close" in text.lower():
            keep = False
        headers[key] = text if key not in headers else f"{headers[key]}, {text}"
    status = int(match.group(2))
    return status, headers, length, keep


def _bad_line(lines: list[bytes]) -> str:
    """What is wrong with the first header line that is not `token: value`."""
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            return f"header line {line[:80]!r}"
        if b"\0" in value or b"\r" in value or b"\n" in value:
            return f"header value {line[:80]!r}"
    return "header block"  # not reached: the block's match fails on some line


async def _send(conn: _Connection, wire: bytes) -> None:
    try:
        await sockio.send_all(conn.stream, wire)
    except (trio.BrokenResourceError, OSError) as error:
        raise WriteFailed(f"send failed: {error!r}") from error
