"""The hostile clients of the front-door soak, run in a process of their own so that their
work never takes the CPU of the server they attack (a real router's attackers are other
machines): slow-head, slow-body, never-reading and idle-flood clients, all at once.

    python -m tests.router.front_door_attack PORT SECONDS

attacks 127.0.0.1:PORT for SECONDS. It prints "attacking" when the attack starts and, once
every attacker has closed its connections, one line of JSON: how many times each limit
cut its attacker."""

from __future__ import annotations

import json
import select
import socket
import sys

import trio

READY = "attacking"


# Each limit and how many times it cut its attacker.
Cut = dict[str, int]
LIMITS = ("slow head cut", "slow body cut", "never read dropped", "idle reclaimed")


async def until_closed(stream: trio.SocketStream) -> bytes:
    received = b""
    try:
        while data := await stream.receive_some(65536):
            received += data
    except trio.BrokenResourceError:
        pass
    return received


async def slow_head(port: int, cut: Cut, end: float) -> None:
    while trio.current_time() < end:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        with trio.move_on_at(end):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    _trickle, stream, b"GET /health HTTP/1.1\r\nX-Slow: " + b"a" * 200
                )
                # 408 at the head timeout, or 503 when the connection cap reclaimed it
                # (a trickled head has waited since its connection was accepted).
                if (await until_closed(stream))[:12] in (b"HTTP/1.1 408", b"HTTP/1.1 503"):
                    cut["slow head cut"] += 1
                nursery.cancel_scope.cancel()
        await stream.aclose()


async def slow_body(port: int, cut: Cut, end: float) -> None:
    head = b"POST /v1/embeddings HTTP/1.1\r\nHost: localhost\r\nContent-Length: 500\r\n\r\n"
    while trio.current_time() < end:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(head)
        with trio.move_on_at(end):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_trickle, stream, b"{" + b" " * 499)
                # 408 at the body timeout, or 503 when the connection cap reclaimed it: on
                # a fast host the idle flood reconnects so quickly that a body's 20 ms
                # between bytes is the longest any connection has waited.
                if (await until_closed(stream))[:12] in (b"HTTP/1.1 408", b"HTTP/1.1 503"):
                    cut["slow body cut"] += 1
                nursery.cancel_scope.cancel()
        await stream.aclose()


async def _trickle(stream: trio.SocketStream, data: bytes) -> None:
    try:
        for i in range(len(data)):
            await stream.send_all(data[i : i + 1])
            await trio.sleep(0.02)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    await trio.sleep_forever()


async def never_read(port: int, cut: Cut, end: float) -> None:
    body = json.dumps({"model": "primary", "input": "a"}).encode()
    head = b"POST /v1/embeddings HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n"
    request = head % len(body)
    while trio.current_time() < end:
        sock = trio.socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        await sock.connect(("127.0.0.1", port))
        stream = trio.SocketStream(sock)
        with trio.move_on_at(end):
            try:
                for _ in range(64):  # 16 MiB of answers, never read
                    await stream.send_all(request + body)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            if await _reset_without_reading(sock):
                cut["never read dropped"] += 1
        await stream.aclose()


async def _reset_without_reading(sock) -> bool:
    """Wait, reading nothing, until the server resets the connection."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLERR | select.POLLHUP)
    while not poller.poll(0):
        await trio.sleep(0.02)
    return True


async def idle_flood(port: int, cut: Cut, end: float, held: int) -> None:
    """Keep `held` connections open without sending anything; count the ones closed."""

    async def one() -> None:
        while trio.current_time() < end:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            with trio.move_on_at(end):
                await until_closed(stream)
                cut["idle reclaimed"] += 1
            await stream.aclose()
            await trio.sleep(0.01)  # reconnects at once, but not in a hot loop of this process

    async with trio.open_nursery() as nursery:
        for _ in range(held):
            nursery.start_soon(one)


async def attack(port: int, seconds: float) -> dict[str, int]:
    """Every attacker against 127.0.0.1:`port` for `seconds`; the cut counts. Each attacker
    closes its connection before it returns, so none is left open once this returns."""
    cut: Cut = dict.fromkeys(LIMITS, 0)
    with trio.fail_after(seconds + 10):
        end = trio.current_time() + seconds
        print(READY, flush=True)
        async with trio.open_nursery() as nursery:
            for _ in range(16):
                nursery.start_soon(slow_head, port, cut, end)
            for _ in range(8):
                nursery.start_soon(slow_body, port, cut, end)
            for _ in range(8):
                nursery.start_soon(never_read, port, cut, end)
            nursery.start_soon(idle_flood, port, cut, end, 200)
    return cut


def main(argv: list[str]) -> None:
    port, seconds = int(argv[0]), float(argv[1])
    print(json.dumps(trio.run(attack, port, seconds)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
