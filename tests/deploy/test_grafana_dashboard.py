"""deploy/grafana/sr-dashboard.json: a Grafana dashboard of the shape Grafana imports
(panels with PromQL targets, template variables), and labels that the Kubernetes overlays'
ServiceMonitors give the scraped series. Its metric names are checked against a live
`sr serve` in tests/e2e/test_grafana_dashboard_e2e.py."""

from __future__ import annotations

import pytest

from tests.deploy.manifests import one, overlays, rendered
from tests.grafana_dashboard import TARGET_LABELS, expressions, label_names, load, metric_names

SR_LABELS = frozenset({"deployment", "route", "outcome", "replica", "le"})


def test_the_dashboard_has_grafanas_shape():
    dashboard = load()
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "namespace", "job", "deployment"}
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert {"h", "w", "x", "y"} <= set(grid) and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["type"] in {"timeseries", "stat", "table"} and panel["description"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [target["refId"] for target in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}")
            assert metric_names(expr), expr
            # every series is narrowed by the dashboard's variables
            for variable in ("$job", "$namespace", "$deployment"):
                assert variable in expr, (panel["title"], expr)


def test_each_panel_the_issue_names_is_there():
    exprs = " ".join(expressions(load()))
    for metric in (
        "sr_requests_total", "sr_request_duration_seconds_bucket",
        "sr_request_queue_seconds_bucket", "sr_request_inference_seconds_bucket",
        "sr_replica_inflight", "sr_replica_batch_rows_bucket",
        "sr_replica_batch_padded_tokens_bucket", "sr_replica_ejections_total",
        "sr_replica_readmissions_total", "sr_replica_restarts_total",
    ):  # fmt: skip
        assert metric in exprs, metric


def test_labels_are_srs_or_those_prometheus_gives_every_target():
    for expr in expressions(load()):
        assert label_names(expr) <= SR_LABELS | TARGET_LABELS, expr


@pytest.mark.parametrize("overlay", [o for o in overlays() if not o.endswith("/cpu")])
def test_the_service_monitor_sets_the_job_the_dashboard_filters_on(overlay):
    """prometheus-operator names the job after the Service's `jobLabel` label: `sr` in
    every overlay, one value for the dashboard's job variable to find."""
    docs = rendered(overlay)
    monitor = one(docs, "ServiceMonitor")
    job_label = monitor["spec"]["jobLabel"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    (service,) = [
        d for d in docs
        if d["kind"] == "Service"
        and all(d["metadata"]["labels"].get(k) == v for k, v in selector.items())
    ]  # fmt: skip
    assert service["metadata"]["labels"][job_label] == "sr"
    # the dashboard's job variable lists the `job` label's values
    (job,) = [v for v in load()["templating"]["list"] if v["name"] == "job"]
    assert "job" in label_names(job["query"]["query"])
