"""A bounded soak of the router's front door (issue 13): slow-head, slow-body,
never-reading and idle-flood clients attack at once, with small limits, while a probe
client keeps asking `/health` on fresh connections. The probe must keep >= 99 % success
with bounded latency, every limit must have cut its attacker at least once, and once the
attack stops no connection is left open."""

from __future__ import annotations

import json
import select
import socket
import time

import trio

from sr.http.asgi_adapter import AsgiAdapter
from sr.http.limits import HttpLimits
from sr.http.server import H1Server, open_listeners
from sr.router.app import RouterApp
from sr.router.cache import ResultCache
from sr.router.metrics import RouterMetrics
from tests.chaos.harness import write_report_row

from .fake_core import FakeReply, FakeRouterCore, make_config

ATTACK_S = 4.0
LIMITS = HttpLimits(
    head_timeout_s=0.4,
    body_timeout_s=0.6,
    write_timeout_s=0.4,
    keep_alive_timeout_s=30.0,  # the idle flood is cut by the cap, not by idling
    max_connections=64,
)
BIG = b"x" * (256 * 1024)


async def big_answers(deployment, path, body, timeout_s):
    """Every embeddings answer is 256 KiB: a caller that does not read fills its buffers."""
    answer = {"model": json.loads(body)["model"], "data": BIG.decode()}
    return FakeReply(200, {}, json.dumps(answer).encode(), f"{deployment}-0")


class Counts:
    def __init__(self) -> None:
        self.cut: dict[str, int] = dict.fromkeys(
            ["slow head cut", "slow body cut", "never read dropped", "idle reclaimed"], 0
        )
        self.probes: list[tuple[bool, float]] = []


async def _until_closed(stream: trio.SocketStream) -> bytes:
    received = b""
    try:
        while data := await stream.receive_some(65536):
            received += data
    except trio.BrokenResourceError:
        pass
    return received


async def slow_head(port: int, counts: Counts, end: float) -> None:
    while trio.current_time() < end:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        with trio.move_on_at(end):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    _trickle, stream, b"GET /health HTTP/1.1\r\nX-Slow: " + b"a" * 200
                )
                # 408 at the head timeout, or 503 when the connection cap reclaimed it
                # (a trickled head has waited since its connection was accepted).
                if (await _until_closed(stream))[:12] in (b"HTTP/1.1 408", b"HTTP/1.1 503"):
                    counts.cut["slow head cut"] += 1
                nursery.cancel_scope.cancel()
        await stream.aclose()


async def slow_body(port: int, counts: Counts, end: float) -> None:
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
                if (await _until_closed(stream))[:12] in (b"HTTP/1.1 408", b"HTTP/1.1 503"):
                    counts.cut["slow body cut"] += 1
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


async def never_read(port: int, counts: Counts, end: float) -> None:
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
                counts.cut["never read dropped"] += 1
        await stream.aclose()


async def _reset_without_reading(sock) -> bool:
    """Wait, reading nothing, until the server resets the connection."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLERR | select.POLLHUP)
    while not poller.poll(0):
        await trio.sleep(0.02)
    return True


async def idle_flood(port: int, counts: Counts, end: float, held: int) -> None:
    """Keep `held` connections open without sending anything; count the ones closed."""

    async def one() -> None:
        while trio.current_time() < end:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            with trio.move_on_at(end):
                await _until_closed(stream)
                counts.cut["idle reclaimed"] += 1
            await stream.aclose()
            await trio.sleep(0.01)  # reconnects at once, but not in a hot loop of this process

    async with trio.open_nursery() as nursery:
        for _ in range(held):
            nursery.start_soon(one)


async def probe(port: int, counts: Counts, end: float) -> None:
    request = b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    while trio.current_time() < end:
        started = time.perf_counter()
        ok = False
        with trio.move_on_after(3):
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                await stream.send_all(request)
                ok = (await _until_closed(stream)).startswith(b"HTTP/1.1 200")
                await stream.aclose()
            except OSError:
                pass
        counts.probes.append((ok, time.perf_counter() - started))
        await trio.sleep(0.02)


async def test_probes_keep_succeeding_while_hostile_clients_are_cut_off():
    config = make_config({"primary": 1})
    core = FakeRouterCore(config, big_answers)
    app = RouterApp(
        core, config, metrics=RouterMetrics(core.inventory), cache=ResultCache(0),
        body_timeout_s=LIMITS.body_timeout_s,
    )  # fmt: skip
    server = H1Server(adapter=AsgiAdapter(app), limits=LIMITS)
    listeners, _ = await open_listeners(host="127.0.0.1", port=0)
    port = listeners[0].socket.getsockname()[1]
    counts = Counts()
    with trio.fail_after(ATTACK_S + 10):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve, listeners)
            end = trio.current_time() + ATTACK_S
            async with trio.open_nursery() as attack:
                for _ in range(16):
                    attack.start_soon(slow_head, port, counts, end)
                for _ in range(8):
                    attack.start_soon(slow_body, port, counts, end)
                for _ in range(8):
                    attack.start_soon(never_read, port, counts, end)
                attack.start_soon(idle_flood, port, counts, end, 200)
                attack.start_soon(probe, port, counts, end)
            # The attack is over and every attacker closed its side: nothing stays open.
            while server.open_connections():
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    successes = [latency for ok, latency in counts.probes if ok]
    latencies = sorted(latency for _, latency in counts.probes)
    write_report_row(
        {"scenario": "front_door_soak", "sent": len(counts.probes), "ok": len(successes),
         "errors": {}, "lost": len(counts.probes) - len(successes),
         "max_latency_ms": round(latencies[-1] * 1000),
         "p50_ms": round(latencies[len(latencies) // 2] * 1000),
         **{key.replace(" ", "_"): n for key, n in counts.cut.items()}}
    )  # fmt: skip
    assert len(counts.probes) >= 10
    assert len(successes) >= 0.99 * len(counts.probes), counts.probes
    assert max(latency for _, latency in counts.probes) < 2.0
    assert all(cut > 0 for cut in counts.cut.values()), counts.cut
