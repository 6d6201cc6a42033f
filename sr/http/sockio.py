"""Socket reads and writes that go through trio's scheduler only when they must wait.

trio makes every socket operation a checkpoint: a `send` or `recv` that succeeds at once
still yields to the run loop afterwards (a pass through the scheduler and an `epoll_wait`
system call). A request through the router met four such yields on the caller's critical
path: reading the request, writing it to the worker, reading the worker's answer, writing
the answer (docs/benchmarks.md). These helpers try the non-blocking system call first and
wait for readiness, a cancellable checkpoint, only when it would block; trio's public
`wait_readable` / `wait_writable` on the socket's descriptor do the waiting.

What trio's streams gave that is kept: errors become `trio.BrokenResourceError` (reset,
broken pipe) or `trio.ClosedResourceError` (the socket was closed here). What is not: a
read or write that need not wait is neither a scheduling point nor a cancel point, so a
loop built only of such calls never lets other tasks run, and a call in a cancelled scope
goes ahead when the socket is ready. Callers decide where that matters: sr.http.server adds
a checkpoint to any request cycle that never waited (a pipelining caller cannot starve
other connections) and writes no answer once the caller hung up; the hop client checks
for cancellation before it sends a request, and always waits for its worker's answer.
(A cancel point on every call, trio's `checkpoint_if_cancelled`, cost about 3,000
instructions each, 1.4 % of the worker's whole `/health` cycle, measured with
callgrind; docs/benchmarks.md.) Streams that are not sockets fall back to their own
methods.
"""

from __future__ import annotations

import math
import os

import trio


async def receive_some(stream: trio.abc.Stream, max_bytes: int) -> bytes:
    """Up to `max_bytes` bytes; b"" at end of stream."""
    data, _ = await receive_some_noting_wait(stream, max_bytes)
    return data


async def receive_some_noting_wait(stream: trio.abc.Stream, max_bytes: int) -> tuple[bytes, bool]:
    """Up to `max_bytes` bytes (b"" at end of stream), and whether the read had to wait."""
    if type(stream) is not trio.SocketStream:
        return await stream.receive_some(max_bytes), True
    sock = stream.socket
    waited = False
    while True:
        fd = sock.fileno()
        if fd < 0:
            raise trio.ClosedResourceError("the socket was closed")
        try:
            return os.read(fd, max_bytes), waited
        except BlockingIOError:
            pass
        except OSError as error:
            raise trio.BrokenResourceError(f"read failed: {error!r}") from error
        await trio.lowlevel.wait_readable(sock)
        waited = True


class SendTimeout(trio.BrokenResourceError):
    """The peer did not take the data before the deadline (it does not read)."""


async def send_all(stream: trio.abc.Stream, data: bytes, timeout_s: float = math.inf) -> None:
    """All of `data`, waiting only while the socket's send buffer is full, and then only
    for `timeout_s` from the first wait in all: SendTimeout after it. The timeout costs a
    clock read and a cancel scope only when the write has to wait, which an answer to a
    caller that reads seldom does."""
    if type(stream) is not trio.SocketStream:
        with trio.move_on_after(timeout_s):
            await stream.send_all(data)
            return
        raise SendTimeout("the peer did not read in time")
    sock = stream.socket
    if sock.did_shutdown_SHUT_WR:
        raise trio.ClosedResourceError("cannot send after sending EOF")
    view = memoryview(data)
    sent = 0
    deadline = None
    while sent < len(view):
        fd = sock.fileno()
        if fd < 0:
            raise trio.ClosedResourceError("the socket was closed")
        try:
            sent += os.write(fd, view[sent:])
            continue
        except BlockingIOError:
            pass
        except OSError as error:
            raise trio.BrokenResourceError(f"write failed: {error!r}") from error
        if deadline is None:
            deadline = trio.current_time() + timeout_s
        with trio.move_on_at(deadline) as waiting:
            await trio.lowlevel.wait_writable(sock)
        if waiting.cancelled_caught:
            raise SendTimeout("the peer did not read in time")
