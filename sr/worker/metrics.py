"""The worker's own Prometheus registry (one per WorkerService, so in-process replicas
never share counters)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_BATCH_ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_PADDED_TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 8192, 16384, 65536)


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "sr_worker_requests", "HTTP requests answered", ["route", "status"], registry=r
        )
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
        self.queued_rows = Gauge("sr_worker_queued_rows", "rows waiting for a forward", registry=r)

    def observe_forward(self, rows: int, padded: int, requests: int) -> None:
        self.forwards.inc()
        self.rows.inc(rows)
        self.batch_rows.observe(rows)
        self.batch_padded_tokens.observe(padded)
        self.batch_requests.observe(requests)

    def watch_queue(self, queued_rows: Callable[[], int]) -> None:
        self.queued_rows.set_function(queued_rows)

    def render(self) -> bytes:
        return generate_latest(self.registry)
