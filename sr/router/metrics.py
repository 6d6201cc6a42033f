"""Prometheus metrics of one router, in its own CollectorRegistry.

Three sources:
- the front end counts requests by outcome and observes latency (`observe_request`);
- pool events feed restart, ejection and readmission counters (`on_event`, subscribed to
  the EventSink), so the pool never imports Prometheus;
- replica readiness, ejection, in-flight requests and outstanding bytes are read from the pool's
  inventory at scrape time by a custom collector, so they are never stale.

A per-router registry (not the process-global one) lets several routers, or tests, live in
one process without clashing metric names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sr.router import inventory_view

METRICS_CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip


class InventoryCollector(Collector):
    """Per-replica gauges read from the pool inventory at scrape time."""

    def __init__(self, inventory: Callable[[], dict[str, Any]]):
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
        for name, deployment in inventory_view.deployments(self._inventory()):
            members = inventory_view.replicas(deployment)
            desired.add_metric([name], inventory_view.number(deployment.get("desired_replicas")))
            ready_total = 0.0
            for replica in members:
                key = [name, inventory_view.replica_id(replica)]
                is_ready = inventory_view.number(replica.get("ready"))
                ready_total += is_ready
                ready.add_metric(key, is_ready)
                inflight.add_metric(key, inventory_view.number(replica.get("inflight")))
                outstanding.add_metric(key, inventory_view.number(replica.get("outstanding_bytes")))
                ejected.add_metric(key, 1.0 if replica.get("state") == "ejected" else 0.0)
            reported = deployment.get("ready_replicas")
            ready_count.add_metric(
                [name], ready_total if reported is None else inventory_view.number(reported)
            )
        yield from (ready, inflight, outstanding, ejected, desired, ready_count)


class RouterMetrics:
    def __init__(self, inventory: Callable[[], dict[str, Any]]):
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
        self.registry.register(InventoryCollector(inventory))
        # Label lookups cost a lock and a tuple; the hot path keeps its children here.
        self._request_children: dict[tuple[str, str, str], Any] = {}
        self._latency_children: dict[tuple[str, str], Any] = {}

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

    def render(self) -> bytes:
        return generate_latest(self.registry)


_REPLICA_EVENTS = frozenset({"replica_restarted", "replica_ejected", "replica_readmitted"})
