"""Each replica's batch metrics at the router's /metrics, labelled deployment and replica.

Pulled, not pushed: when the router is scraped, `Supervisor.replica_metrics` asks every
replica with a connection for its GET /metrics over the pool's own worker transport, in
parallel, each bounded by REPLICA_SCRAPE_TIMEOUT_S; this collector re-emits the families
below under router names. Pulling keeps the worker passive (no timer, no socket to the
router, nothing to buffer while nobody scrapes), the numbers are as fresh as the scrape,
and a worker that is stuck shows as down instead of as a stale last push. The cost is one
small exchange per replica per scrape, outside dispatch: a scrape is not counted as a
request and adds no outstanding bytes.

Rules:
- Only the families in RENAMED are re-emitted (`sr_worker_*` -> `sr_replica_*`), with the
  worker's own labels plus `deployment` and `replica`; no `_created` sample is kept.
- `sr_replica_metrics_up{deployment,replica}` is 1 for a replica whose text was read and
  parsed, 0 for one that did not answer 200 in time or sent text that does not parse (its
  batch series are then left out of this scrape). A replica without a connection
  (starting, stopped) is in neither.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

if TYPE_CHECKING:  # the router's front end does not import the pool at run time
    from sr.pool.worker_exchange import ReplicaScrape

REPLICA_SCRAPE_TIMEOUT_S = 1.0
RENAMED = {
    "sr_worker_batch_rows": ("sr_replica_batch_rows", "Rows per forward"),
    "sr_worker_batch_padded_tokens": (
        "sr_replica_batch_padded_tokens", "Padded tokens per forward",
    ),
    "sr_worker_batch_requests": ("sr_replica_batch_requests", "Requests sharing a forward"),
    "sr_worker_forward_seconds": (
        "sr_replica_forward_seconds", "Time of one batched forward on the replica's device",
    ),
    "sr_worker_queued_rows": ("sr_replica_queued_rows", "Rows waiting for a forward"),
    "sr_worker_rows": ("sr_replica_rows", "Rows computed by forwards"),
    "sr_worker_forwards": ("sr_replica_forwards", "Batched forwards run"),
}  # fmt: skip


class ReplicaMetricsCollector(Collector):
    """Re-emits the scrapes it was last given (`collect` runs inside `RouterMetrics.render`,
    right after they are set)."""

    def __init__(self) -> None:
        self.scrapes: Sequence[ReplicaScrape] = ()

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "sr_replica_metrics_up",
            "1 if the replica's own /metrics was read at this scrape",
            labels=["deployment", "replica"],
        )
        renamed: dict[str, Metric] = {}
        for scrape in self.scrapes:
            families = _parse(scrape.text)
            up.add_metric([scrape.deployment, scrape.replica], 0.0 if families is None else 1.0)
            for family in families or ():
                _add_renamed(renamed, family, scrape.deployment, scrape.replica)
        yield up
        yield from renamed.values()


def _parse(text: str | None) -> list[Metric] | None:
    if text is None:
        return None
    try:
        return list(text_string_to_metric_families(text))
    except ValueError:  # a replica that is not an sr worker, or a broken answer
        return None


def _add_renamed(into: dict[str, Metric], family: Metric, deployment: str, replica: str) -> None:
    target = RENAMED.get(family.name)
    if target is None:
        return
    name, documentation = target
    metric = into.get(name)
    if metric is None:
        metric = into[name] = Metric(name, documentation, family.type)
    created = family.name + "_created"
    for sample in family.samples:
        if sample.name == created:
            continue
        suffix = sample.name[len(family.name) :]  # "", "_total", "_bucket", "_sum", "_count"
        labels = {**sample.labels, "deployment": deployment, "replica": replica}
        metric.add_sample(name + suffix, labels, sample.value)
