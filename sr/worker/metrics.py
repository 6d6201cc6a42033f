"""The worker's own Prometheus registry (one per WorkerService, so in-process replicas
never share counters).

- `sr_worker_requests{route,status}` counts requests for work and everything else a caller
  asked; the pool's probes (`/health`, `/health/live`) and scrapes (`/metrics`) are counted
  apart in `sr_worker_probes{route,status}`, so the request counter is not mostly the
  prober's every-few-seconds `/health`.
- Per forward: rows, padded tokens, requests sharing it and its duration on the device
  thread. The router re-emits these per replica (sr.router.replica_metrics).
- The text has no `_created` series (sr.exposition).
- A request does not pay prometheus_client's lock and bucket loop per value: its answer
  is counted in a plain dict, folded into the request counters on a scrape and every
  FOLD_EVERY answers; its forwards go to plain counts (`_ForwardSeries`, only ever touched
  on the Trio thread), written on a scrape as the families, values and order that
  prometheus_client's Counter and Histogram wrote.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from sr import exposition

PROBE_ROUTES = frozenset({"/health", "/health/live", "/metrics"})
_BATCH_ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_PADDED_TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 8192, 16384, 65536)
FORWARD_SECONDS_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
# Answers counted before they are folded into the registry (a scrape folds them too).
FOLD_EVERY = 256


class _Histogram:
    """A histogram's counts per bucket and sum, as prometheus_client keeps them (the sum
    added one value at a time, so it has the same bits)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.sum += value
        self.counts[bisect.bisect_left(self.bounds, value)] += 1

    def family(self, name: str, documentation: str) -> HistogramMetricFamily:
        buckets, total = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += count
            buckets.append((floatToGoString(bound), float(total)))
        return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=self.sum)


class _ForwardSeries:
    """The per-forward series, a collector of the worker's registry."""

    def __init__(self) -> None:
        self.rows = 0
        self.forwards = 0
        self.batch_rows = _Histogram(_BATCH_ROW_BUCKETS)
        self.batch_padded_tokens = _Histogram(_PADDED_TOKEN_BUCKETS)
        self.batch_requests = _Histogram(_BATCH_ROW_BUCKETS)
        self.forward_seconds = _Histogram(FORWARD_SECONDS_BUCKETS)

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily("sr_worker_rows", "rows computed by forwards", float(self.rows))
        yield CounterMetricFamily(
            "sr_worker_forwards", "batched forwards run", float(self.forwards)
        )
        yield self.batch_rows.family("sr_worker_batch_rows", "rows per forward")
        yield self.batch_padded_tokens.family(
            "sr_worker_batch_padded_tokens", "padded tokens per forward"
        )
        yield self.batch_requests.family("sr_worker_batch_requests", "requests sharing a forward")
        yield self.forward_seconds.family(
            "sr_worker_forward_seconds", "time of one batched forward on the device thread"
        )


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
        self.forward_series = _ForwardSeries()
        r.register(self.forward_series)
        self.queued_rows = Gauge("sr_worker_queued_rows", "rows waiting for a forward", registry=r)
        # Label lookups cost a lock and a tuple; answers keep their children here.
        self._answer_children: dict[tuple[str, int], Any] = {}
        # Answers not folded yet, per (route, status), and how many.
        self._answers: dict[tuple[str, int], int] = {}
        self._notes = 0

    def count_answer(self, route: str, status: int) -> None:
        """One answered request: a probe or scrape in `probes`, anything else in `requests`."""
        key = (route, status)
        answers = self._answers
        answers[key] = answers.get(key, 0) + 1
        self._notes += 1
        if self._notes >= FOLD_EVERY:
            self.fold()

    def observe_forward(self, rows: int, padded: int, requests: int, seconds: float) -> None:
        series = self.forward_series
        series.forwards += 1
        series.rows += rows
        series.batch_rows.observe(rows)
        series.batch_padded_tokens.observe(padded)
        series.batch_requests.observe(requests)
        series.forward_seconds.observe(seconds)

    def fold(self) -> None:
        """Add the answers counted so far to the request counters."""
        self._notes = 0
        answers, self._answers = self._answers, {}
        for key, count in answers.items():
            child = self._answer_children.get(key)
            if child is None:
                route, status = key
                family = self.probes if route in PROBE_ROUTES else self.requests
                child = self._answer_children[key] = family.labels(route, str(status))
            child.inc(count)

    def watch_queue(self, queued_rows: Callable[[], int]) -> None:
        self.queued_rows.set_function(queued_rows)

    def render(self) -> bytes:
        self.fold()
        return exposition.render(self.registry)
