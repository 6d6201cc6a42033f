"""Prometheus metrics of one router, in its own CollectorRegistry.

Sources:
- the front end counts requests by outcome and observes latency (`observe_request`);
- a worker's answer carries its timing (sr.worker.timing); `observe_reply` turns it into
  queue and inference histograms and an input-token counter;
- pool events feed restart, ejection and readmission counters (`on_event`, subscribed to
  the EventSink), so the pool never imports Prometheus;
- replica readiness, ejection, in-flight requests and outstanding bytes are read from the pool's
  inventory at scrape time by a custom collector, so they are never stale;
- each replica's batch metrics, pulled from the workers at scrape time and passed to
  `render` (sr.router.replica_metrics);
- `sr_build_info` and `sr_model_info` (from the config at scrape time, so a reload shows),
  and prometheus_client's process and platform collectors.

A per-router registry (not the process-global one) lets several routers, or tests, live in
one process without clashing metric names. The text has no `_created` series
(sr.exposition says why and how).
"""

from __future__ import annotations

import importlib.metadata
import platform
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

import sr
from sr import exposition
from sr.pool.state import ReplicaState
from sr.router.replica_metrics import ReplicaMetricsCollector
from sr.worker.timing import WorkerTiming

if TYPE_CHECKING:
    from sr.config.schema import Deployment
    from sr.pool.views import Inventory
    from sr.pool.worker_exchange import ReplicaScrape

METRICS_CONTENT_TYPE = exposition.CONTENT_TYPE
LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
# Queue and inference times (the workers send microseconds): from 1 ms, where a forward's
# parts begin to matter.
WORKER_TIME_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


class InventoryCollector(Collector):
    """Per-replica gauges read from the pool inventory at scrape time."""

    def __init__(self, inventory: Callable[[], Inventory]):
        self._inventory = inventory

    def collect(self) -> Iterator[Metric]:
        labels = ["deployment", "replica"]
        ready = GaugeMetricFamily("sr_replica_ready", "1 if the replica takes work", labels=labels)
        inflight = GaugeMetricFamily(
            "sr_replica_inflight", "HTTP requests in flight to the replica", labels=labels
        )
        outstanding = GaugeMetricFamily(
            "sr_replica_outstanding_bytes",
            "Request body bytes in flight to the replica (dispatch estimate)",
            labels=labels,
        )
        desired = GaugeMetricFamily(
            "sr_deployment_desired_replicas", "Replicas in the config", labels=["deployment"]
        )
        ready_count = GaugeMetricFamily(
            "sr_deployment_ready_replicas", "Replicas ready to take work", labels=["deployment"]
        )
        # From the snapshot, not from eject/readmit events: a replica that restarts or is
        # retired while ejected never gets a readmission event, and the gauge must not lie.
        ejected = GaugeMetricFamily(
            "sr_replica_ejected", "1 while the replica is ejected", labels=labels
        )
        for name, deployment in self._inventory().deployments.items():
            desired.add_metric([name], deployment.desired_replicas)
            ready_count.add_metric([name], deployment.ready_replicas)
            for replica in deployment.replicas:
                key = [name, replica.id]
                ready.add_metric(key, 1.0 if replica.ready else 0.0)
                inflight.add_metric(key, replica.inflight)
                outstanding.add_metric(key, replica.outstanding_bytes)
                is_ejected = replica.state is ReplicaState.EJECTED
                ejected.add_metric(key, 1.0 if is_ejected else 0.0)
        yield from (ready, inflight, outstanding, ejected, desired, ready_count)


class InfoCollector(Collector):
    """`sr_build_info{version,python,torch}` and `sr_model_info{deployment,artifact,revision,
    dtype}`, both 1 (the info-metric idiom: join on them, never sum them). `dtype` is what
    a ready replica's card says it serves (a deployment's `auto` is resolved per host), else
    the configured one."""

    def __init__(
        self,
        deployments: Callable[[], Mapping[str, Deployment]] | None,
        served_dtype: Callable[[str], str | None] | None = None,
    ):
        self._deployments = deployments
        self._served_dtype = served_dtype
        self._build = [sr.__version__, platform.python_version(), _installed_version("torch")]

    def collect(self) -> Iterator[Metric]:
        build = GaugeMetricFamily(
            "sr_build_info", "sr's build: always 1", labels=["version", "python", "torch"]
        )
        build.add_metric(self._build, 1.0)
        yield build
        if self._deployments is None:
            return
        model = GaugeMetricFamily(
            "sr_model_info",
            "The model each deployment serves: always 1",
            labels=["deployment", "artifact", "revision", "dtype"],
        )
        for name, deployment in self._deployments().items():
            served = self._served_dtype(name) if self._served_dtype is not None else None
            dtype = served or deployment.dtype
            labels = [name, deployment.artifact, deployment.revision or "", dtype]
            model.add_metric(labels, 1.0)
        yield model


class RouterMetrics:
    def __init__(
        self,
        inventory: Callable[[], Inventory],
        *,
        deployments: Callable[[], Mapping[str, Deployment]] | None = None,
        served_dtype: Callable[[str], str | None] | None = None,
    ):
        """`inventory`: the pool's inventory; `deployments`: the config's deployments now
        (for `sr_model_info`; without it that family is left out); `served_dtype`: the dtype
        a deployment's ready replicas serve, or None (sr_model_info's `dtype` label)."""
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "sr_requests",
            "Requests answered by the router, by outcome",
            ["deployment", "route", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "sr_request_duration_seconds",
            "Time from request head to answer, in the router",
            ["deployment", "route"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.cache_hits = Counter(
            "sr_result_cache_hits", "Answers served from the result cache", ["deployment"],
            registry=self.registry,
        )  # fmt: skip
        replica_labels = ["deployment", "replica"]
        self.restarts = Counter(
            "sr_replica_restarts", "Worker restarts", replica_labels, registry=self.registry
        )
        self.ejections = Counter(
            "sr_replica_ejections", "Outlier ejections", replica_labels, registry=self.registry
        )
        self.readmissions = Counter(
            "sr_replica_readmissions",
            "Ejected replicas readmitted",
            replica_labels,
            registry=self.registry,
        )
        route_labels = ["deployment", "route"]
        self.queue_time = Histogram(
            "sr_request_queue_seconds",
            "Time a request's rows waited in the worker's queue (its x-queue-time)",
            route_labels, buckets=WORKER_TIME_BUCKETS_S, registry=self.registry,
        )  # fmt: skip
        self.inference_time = Histogram(
            "sr_request_inference_seconds",
            "Time a request's rows spent in forwards (its x-inference-time)",
            route_labels, buckets=WORKER_TIME_BUCKETS_S, registry=self.registry,
        )  # fmt: skip
        self.input_tokens = Counter(
            "sr_input_tokens", "Input tokens the workers computed (x-compute-tokens)",
            route_labels, registry=self.registry,
        )  # fmt: skip
        self.registry.register(InventoryCollector(inventory))
        self._replicas = ReplicaMetricsCollector()
        self.registry.register(self._replicas)
        self.registry.register(InfoCollector(deployments, served_dtype))
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        # Label lookups cost a lock and a tuple; the hot path keeps its children here.
        self._request_children: dict[tuple[str, str, str], Any] = {}
        self._latency_children: dict[tuple[str, str], Any] = {}
        self._reply_children: dict[tuple[str, str], tuple[Any, Any, Any]] = {}

    def observe_request(self, deployment: str, route: str, outcome: str, seconds: float) -> None:
        key = (deployment, route, outcome)
        counter = self._request_children.get(key)
        if counter is None:
            counter = self._request_children[key] = self.requests.labels(*key)
        counter.inc()
        if outcome in ("ok", "cached"):
            latency_key = (deployment, route)
            histogram = self._latency_children.get(latency_key)
            if histogram is None:
                histogram = self._latency_children[latency_key] = self.latency.labels(*latency_key)
            histogram.observe(seconds)

    def observe_reply(self, deployment: str, route: str, timing: WorkerTiming) -> None:
        """A worker's answer for work: its timing (sr.worker.timing) into the queue and
        inference histograms and the token counter."""
        key = (deployment, route)
        children = self._reply_children.get(key)
        if children is None:
            children = self._reply_children[key] = (
                self.queue_time.labels(*key),
                self.inference_time.labels(*key),
                self.input_tokens.labels(*key),
            )
        queue, inference, token_counter = children
        queue.observe(timing.queue_us / 1e6)
        inference.observe(timing.inference_us / 1e6)
        token_counter.inc(timing.tokens)

    def on_event(self, event: str, fields: dict[str, Any]) -> None:
        """EventSink listener for the pool's replica events."""
        if event not in _REPLICA_EVENTS:
            return
        labels = (str(fields.get("deployment", "")), str(fields.get("replica", "")))
        if event == "replica_restarted":
            self.restarts.labels(*labels).inc()
        elif event == "replica_ejected":
            self.ejections.labels(*labels).inc()
        elif event == "replica_readmitted":
            self.readmissions.labels(*labels).inc()

    def render(self, replica_scrapes: Sequence[ReplicaScrape] = ()) -> bytes:
        """The text; `replica_scrapes` (Supervisor.replica_metrics) give the per-replica
        batch series. Setting them and rendering is one synchronous step, so concurrent
        scrapes never see each other's."""
        self._replicas.scrapes = replica_scrapes
        try:
            return exposition.render(self.registry)
        finally:
            self._replicas.scrapes = ()


_REPLICA_EVENTS = frozenset({"replica_restarted", "replica_ejected", "replica_readmitted"})


def _installed_version(distribution: str) -> str:
    """A package's version from its metadata: the router never imports torch for it."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ""
