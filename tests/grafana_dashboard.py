"""deploy/grafana's dashboard, read for tests: its PromQL expressions (panels' targets and
template variables' queries) and the metric and label names they use."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "sr-dashboard.json"
# Labels Prometheus gives every target it scrapes, not sr: prometheus-operator sets `job`
# from the ServiceMonitor's jobLabel and `namespace` from the Service's namespace.
TARGET_LABELS = frozenset({"job", "namespace"})
_METRIC = re.compile(r"\b(sr_[a-z0-9_]+)\b")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"")
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_LABEL_VALUES = re.compile(r"label_values\((?:.*,)?\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$")


def load() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def expressions(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression: the panels' targets, then the variables' queries."""
    found = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found.append(variable["query"]["query"])
    return found


def metric_names(expr: str) -> set[str]:
    return set(_METRIC.findall(expr))


def label_names(expr: str) -> set[str]:
    """Labels an expression matches on, groups by, or asks the values of (`le` included)."""
    names = set(_MATCHER.findall(expr))
    for group in _GROUPING.findall(expr):
        names.update(n.strip() for n in group.split(",") if n.strip())
    if match := _LABEL_VALUES.search(expr.strip()):
        names.add(match.group(1))
    return names
