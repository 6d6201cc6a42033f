"""Prometheus text (format 0.0.4) of sr's own registries, without `_created` series.

prometheus_client gives every counter and histogram a `<name>_created` sample (the time the
series was made); the 0.0.4 text format shows it as one more gauge family per metric, which
doubles the families a scrape stores and that nobody graphs. The library's switch for it,
`disable_created_metrics()` (or PROMETHEUS_DISABLE_CREATED_SERIES, read at import), is
process-global: in a program that embeds sr it would also change that program's own
metrics. So sr leaves the switch alone and drops the samples from its own registries'
output here, for the router and the worker alike.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


class _WithoutCreated:
    """A view of a registry whose families carry no `_created` sample."""

    def __init__(self, registry: Collector) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self._registry.collect():
            created = metric.name + "_created"
            # Families are built afresh by each collect(), so filtering in place is safe.
            metric.samples = [s for s in metric.samples if s.name != created]
            yield metric


def render(registry: Collector) -> bytes:
    """The registry as Prometheus text, without `_created` series."""
    return generate_latest(_WithoutCreated(registry))
