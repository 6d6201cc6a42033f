"""Every metric the Grafana dashboard (deploy/grafana) names, and every sr label it uses,
is in a live `sr serve`'s /metrics (one worker, tiny BERT), after one request and one
worker restart: a dashboard panel over a metric sr does not export would stay empty."""

from __future__ import annotations

import os
import signal

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.grafana_dashboard import TARGET_LABELS, expressions, label_names, load, metric_names
from tests.serve_process import ServeProcess, poll_until, serve_config

pytestmark = pytest.mark.e2e
# the series names each family type exports (prometheus_client's exposition)
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exported(text: str) -> tuple[dict[str, set[str]], set[str]]:
    """(series name -> the labels its samples carry, every series name a family declares,
    samples or not: a labelled counter with no child yet is still declared)."""
    labels: dict[str, set[str]] = {}
    declared: set[str] = set()
    for family in text_string_to_metric_families(text):
        declared.update(family.name + s for s in SUFFIXES.get(family.type, ("",)))
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    return labels, declared


def test_every_dashboard_metric_and_label_is_exported(tmp_path, tiny_model_dir):
    server = ServeProcess(tmp_path, serve_config(tiny_model_dir, 1)).start(timeout_s=60)
    try:
        reply = server.client.post("/v1/embeddings", json={"model": "primary", "input": "hi"})
        assert reply.status_code == 200, reply.text
        (pid,) = server.worker_pids()
        os.kill(pid, signal.SIGKILL)  # a restart: sr_replica_restarts_total gets its series
        poll_until(lambda: server.worker_pids() not in ([], [pid]) and server.all_ready(),
                   timeout_s=60, what="the worker restarted")  # fmt: skip
        text = server.client.get("/metrics").text
    finally:
        assert server.stop() == []
    labels, declared = exported(text)
    for expr in expressions(load()):
        names = metric_names(expr)
        for name in names:
            assert name in labels or name in declared, f"{name} is not exported ({expr})"
        carried = set().union(*(labels.get(name, set()) for name in names))
        if any(name in labels for name in names):
            wanted = label_names(expr) - TARGET_LABELS
            assert wanted <= carried, f"{expr}: {wanted - carried} not on {names}"
