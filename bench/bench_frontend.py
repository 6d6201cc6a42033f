"""Router front-end cost per request, in process: the ASGI app with a pool that answers at once
(with the timing headers a worker sends, which the router observes and passes on).

    python -m bench.bench_frontend [--requests 20000]

No sockets and no HTTP server: this isolates what sr/router/app.py itself spends on a native
request (header scan, body read, JSON parse, metrics, the watch for a caller
hanging up). Two modes: as sr's server serves it (the `sr.http.hang_up`
extension registers each dispatch with the server's poller) and as any other ASGI server
would (no extension: a watcher task in a nursery per request). Prints microseconds per
request; writes bench/results/frontend.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import attrs
import trio

from bench.harness import print_table, write_result
from sr.config.schema import Deployment, Replica, SrConfig
from sr.http.hang_up import EXTENSION, HangUpPoller
from sr.pool.views import Inventory
from sr.router.app import RouterApp
from sr.router.cache import ResultCache
from sr.router.metrics import RouterMetrics

ANSWER = json.dumps(
    {
        "object": "list",
        "model": "/models/primary",
        "data": [{"object": "embedding", "index": 0, "embedding": [0.25] * 384}],
        "usage": {"prompt_tokens": 5, "total_tokens": 5},
    }
).encode()


# What a worker's answer carries (sr.worker.timing): the router reads it for its metrics.
WORKER_HEADERS = {"content-type": "application/json", "x-sr-timing": "3000 200 10 2500 7 24"}


@attrs.define
class _Reply:
    status: int
    headers: dict
    body: bytes
    replica_id: str


class InstantCore:
    """The Supervisor surface the app uses; request_raw answers without any I/O."""

    def resolve(self, model: str) -> str:
        return "primary"

    def __init__(self) -> None:
        # The one scope every dispatch's hang-up watch is pointed at: the real pool points it
        # at the attempt's deadline scope, whose cost is the pool's, not the front end's.
        self._scope = trio.CancelScope()

    async def request_raw(
        self, deployment, path, body, timeout_s=None, request_id=None, watch=None, trace=None
    ):
        stop_watching = watch(self._scope) if watch is not None else None
        try:
            await trio.lowlevel.checkpoint()
        finally:
            if stop_watching is not None:
                stop_watching()
        return _Reply(200, WORKER_HEADERS, ANSWER, "primary-0")

    def inventory(self) -> Inventory:
        return Inventory(ready=True, deployments={})

    def is_ready(self):
        return True


def make_app() -> RouterApp:
    config = SrConfig()
    config.deployments["primary"] = Deployment(
        artifact="/models/primary", replicas=[Replica(device="cpu")]
    )
    cache = ResultCache(0)  # off, as in the hop benchmarks: every request reaches the pool
    core = InstantCore()
    return RouterApp(core, config, metrics=RouterMetrics(core.inventory), cache=cache)


async def per_request_us(app: RouterApp, requests: int, extensions: dict | None) -> list[float]:
    body = json.dumps({"model": "primary", "input": "hello there"}).encode()
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/embeddings",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"43")],
    }
    if extensions is not None:
        scope["extensions"] = extensions
    samples = []

    for i in range(requests):
        delivered = False

        async def receive():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await trio.sleep_forever()

        async def send(message):
            return None

        started = time.perf_counter()
        await app(scope, receive, send)
        if i >= min(200, requests // 5):  # warm-up
            samples.append((time.perf_counter() - started) * 1e6)
    return samples


def served_extensions() -> dict:
    """The `sr.hang_up` extension as sr.http.asgi_adapter offers it: each dispatch is registered
    with the server's poller (not running here: no sockets, so nothing to poll)."""
    poller = HangUpPoller()

    def watch(scope: trio.CancelScope):
        poller.watch(scope, -1, scope.cancel)
        return lambda: poller.unwatch(scope)

    return {EXTENSION: {"watch": watch}}


def summarize(samples: list[float]) -> dict:
    samples = sorted(samples)
    return {
        "requests": len(samples),
        "median_us": round(statistics.median(samples), 2),
        "p99_us": round(samples[int(len(samples) * 0.99)], 2),
    }


def run(requests: int) -> dict:
    """Alternate the two modes in blocks so host noise hits both alike."""
    modes = {
        "as served (sr.http.hang_up extension)": served_extensions,
        "other ASGI servers (watcher task per request)": lambda: None,
    }
    samples: dict[str, list[float]] = {name: [] for name in modes}
    block = max(1000, requests // 10)
    for _ in range(max(1, requests // block)):
        for name, extensions in modes.items():
            samples[name] += trio.run(per_request_us, make_app(), block, extensions())
    return {name: summarize(values) for name, values in samples.items()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    args = parser.parse_args(argv)
    modes = run(args.requests)
    result = {"benchmark": "router front end, in process", "modes": modes}
    print_table(
        ("mode", "median us", "p99 us"),
        [(name, r["median_us"], r["p99_us"]) for name, r in modes.items()],
    )
    write_result("frontend", result)
    return result


if __name__ == "__main__":
    main()
