"""Metrics text: request outcomes, latency, pool event counters, inventory gauges."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from sr.events import EventSink
from sr.router.metrics import RouterMetrics

from .fake_core import FakeRouterCore, make_config


def samples(text: str) -> dict[tuple[str, tuple], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_requests_latency_events_and_inventory_gauges():
    core = FakeRouterCore(make_config({"primary": 2}))
    metrics = RouterMetrics(core.inventory)
    sink = EventSink(log=False)
    sink.subscribe(metrics.on_event)
    metrics.observe_request("primary", "/v1/embeddings", "ok", 0.002)
    metrics.observe_request("primary", "/v1/embeddings", "ok", 0.003)
    metrics.observe_request("primary", "/v1/embeddings", "overloaded", 0.0001)
    sink.emit("replica_restarted", deployment="primary", replica="primary-1", restarts=1)
    sink.emit("replica_ejected", deployment="primary", replica="primary-0", duration_ms=30000)
    sink.emit("replica_readmitted", deployment="primary", replica="primary-0", reason="ok")
    sink.emit("replica_ejected", deployment="primary", replica="primary-0", duration_ms=60000)
    core.replica_states["primary-0"] = "ejected"
    found = samples(metrics.render().decode())

    route = ("route", "/v1/embeddings")
    dep = ("deployment", "primary")
    assert found[("sr_requests_total", (dep, ("outcome", "ok"), route))] == 2
    assert found[("sr_requests_total", (dep, ("outcome", "overloaded"), route))] == 1
    assert found[("sr_request_duration_seconds_count", (dep, route))] == 2
    assert found[("sr_request_duration_seconds_bucket", (dep, ("le", "0.0025"), route))] == 1
    r0, r1 = (dep, ("replica", "primary-0")), (dep, ("replica", "primary-1"))
    assert found[("sr_replica_restarts_total", r1)] == 1
    assert found[("sr_replica_ejections_total", r0)] == 2
    assert found[("sr_replica_readmissions_total", r0)] == 1
    assert found[("sr_replica_ejected", r0)] == 1
    assert found[("sr_replica_ejected", r1)] == 0
    assert found[("sr_replica_ready", r0)] == 0
    assert found[("sr_replica_ready", r1)] == 1
    # Ejected, then restarted (no readmission event): the gauge follows the inventory.
    core.replica_states["primary-0"] = "restarting"
    assert samples(metrics.render().decode())[("sr_replica_ejected", r0)] == 0
    assert found[("sr_replica_inflight", r1)] == 1
    assert found[("sr_replica_outstanding_bytes", r1)] == 100
    assert found[("sr_deployment_desired_replicas", (dep,))] == 2
    assert found[("sr_deployment_ready_replicas", (dep,))] == 2


def test_inventory_is_read_at_scrape_time_and_registries_are_separate():
    core = FakeRouterCore(make_config({"primary": 1}))
    first, second = RouterMetrics(core.inventory), RouterMetrics(core.inventory)
    first.observe_request("primary", "/v1/classify", "ok", 0.01)
    assert "sr_requests_total{" in first.render().decode()
    assert "sr_requests_total{" not in second.render().decode()
    core.ready = False
    found = samples(first.render().decode())
    assert found[("sr_replica_ready", (("deployment", "primary"), ("replica", "primary-0")))] == 0
