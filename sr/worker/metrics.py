"""The worker's own Prometheus registry (one per WorkerService, so in-process replicas
never share counters).

- `sr_worker_requests{route,status}` counts requests for work and everything else a caller
  asked; the pool's probes (`/health`, `/health/live`) and scrapes (`/metrics`) are counted
  apart in `sr_worker_probes{route,status}`, so the request counter is not mostly the
  prober's every-few-seconds `/health`.
- Per forward: rows, padded tokens, requests sharing it and its duration on the device
  thread. The router re-emits these per replica (sr.router.replica_metrics).
- The text has no `_created` series (sr.exposition).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sr import exposition

PROBE_ROUTES = frozenset({"/health", "/health/live", "/metrics"})
_BATCH_ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_PADDED_TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 8192, 16384, 65536)
FORWARD_SECONDS_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "sr_worker_requests", "HTTP requests answered, probes aside", ["route", "status"],
            registry=r,
        )  # fmt: skip
        self.probes = Counter(
            "sr_worker_probes", "Health probes and metrics scrapes answered", ["route", "status"],
            registry=r,
        )  # fmt: skip
        self.rows = Counter("sr_worker_rows", "rows computed by forwards", registry=r)
        self.forwards = Counter("sr_worker_forwards", "batched forwards run", registry=r)
        self.batch_rows = Histogram(
            "sr_worker_batch_rows", "rows per forward", buckets=_BATCH_ROW_BUCKETS, registry=r
        )
        self.batch_padded_tokens = Histogram(
            "sr_worker_batch_padded_tokens",
            "padded tokens per forward",
            buckets=_PADDED_TOKEN_BUCKETS,
            registry=r,
        )
        self.batch_requests = Histogram(
            "sr_worker_batch_requests",
            "requests sharing a forward",
            buckets=_BATCH_ROW_BUCKETS,
            registry=r,
        )
        self.forward_seconds = Histogram(
            "sr_worker_forward_seconds",
            "time of one batched forward on the device thread",
            buckets=FORWARD_SECONDS_BUCKETS,
            registry=r,
        )
        self.queued_rows = Gauge("sr_worker_queued_rows", "rows waiting for a forward", registry=r)
        # Label lookups cost a lock and a tuple; answers keep their children here.
        self._answer_children: dict[tuple[str, int], Any] = {}

    def count_answer(self, route: str, status: int) -> None:
        """One answered request: a probe or scrape in `probes`, anything else in `requests`."""
        key = (route, status)
        child = self._answer_children.get(key)
        if child is None:
            family = self.probes if route in PROBE_ROUTES else self.requests
            child = self._answer_children[key] = family.labels(route, str(status))
        child.inc()

    def observe_forward(self, rows: int, padded: int, requests: int, seconds: float) -> None:
        self.forwards.inc()
        self.rows.inc(rows)
        self.batch_rows.observe(rows)
        self.batch_padded_tokens.observe(padded)
        self.batch_requests.observe(requests)
        self.forward_seconds.observe(seconds)

    def watch_queue(self, queued_rows: Callable[[], int]) -> None:
        self.queued_rows.set_function(queued_rows)

    def render(self) -> bytes:
        return exposition.render(self.registry)
