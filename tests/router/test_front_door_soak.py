"""A bounded soak of the router's front door. The rule: hostile clients must not starve
honest ones. Slow-head, slow-body, never-reading and idle-flood clients attack at once,
with small limits, while a probe client keeps asking `/health` on fresh connections. The
probe must keep >= 99 % success with bounded latency, every limit must have cut its
attacker at least once, and once the attack stops no connection is left open.

The attackers run in a process of their own (`front_door_attack`), as a real router's
attackers are other machines: in this process their client work would starve the server
of CPU and the probe would measure the harness. The probe stays here, next to the server
it measures."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import trio

from sr.http.asgi_adapter import AsgiAdapter
from sr.http.limits import HttpLimits
from sr.http.server import H1Server, open_listeners
from sr.router.app import RouterApp
from sr.router.cache import ResultCache
from sr.router.metrics import RouterMetrics
from tests.chaos.harness import write_report_row

from .fake_core import FakeReply, FakeRouterCore, make_config
from .front_door_attack import until_closed

ROOT = Path(__file__).resolve().parents[2]
ATTACKERS = "tests.router.front_door_attack"

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


class Lines:
    """The lines a process writes to its stdout, one at a time."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self.stream, self.buffer = stream, b""

    async def next(self) -> str:
        while b"\n" not in self.buffer:
            data = await self.stream.receive_some(65536)
            assert data, f"the attack process ended its output early: {self.buffer!r}"
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()


async def probe(port: int, probes: list[tuple[bool, float]], end: float) -> None:
    request = b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    while trio.current_time() < end:
        started = time.perf_counter()
        ok = False
        with trio.move_on_after(3):
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                await stream.send_all(request)
                ok = (await until_closed(stream)).startswith(b"HTTP/1.1 200")
                await stream.aclose()
            except OSError:
                pass
        probes.append((ok, time.perf_counter() - started))
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
    probes: list[tuple[bool, float]] = []
    with trio.fail_after(ATTACK_S + 10):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve, listeners)
            command = [sys.executable, "-m", ATTACKERS, str(port), str(ATTACK_S)]
            run = partial(trio.run_process, command, cwd=ROOT, stdout=subprocess.PIPE)
            attackers = await nursery.start(run)
            output = Lines(attackers.stdout)
            assert await output.next() == "attacking"
            # The probe's window is the attack's: it sees the opening burst too.
            await probe(port, probes, trio.current_time() + ATTACK_S)
            cut = json.loads(await output.next())
            await attackers.wait()
            # The attack is over and the attackers' process is gone: nothing stays open.
            while server.open_connections():
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    successes = [latency for ok, latency in probes if ok]
    latencies = sorted(latency for _, latency in probes)
    write_report_row(
        {"scenario": "front_door_soak", "sent": len(probes), "ok": len(successes),
         "errors": {}, "lost": len(probes) - len(successes),
         "max_latency_ms": round(latencies[-1] * 1000),
         "p50_ms": round(latencies[len(latencies) // 2] * 1000),
         **{key.replace(" ", "_"): n for key, n in cut.items()}}
    )  # fmt: skip
    assert len(probes) >= 10
    assert len(successes) >= 0.99 * len(probes), probes
    assert max(latency for _, latency in probes) < 2.0
    assert all(n > 0 for n in cut.values()), cut
