"""What `sr serve` prints on stdout: its milestones, never a replica's state.

Replica state changes are the log's (stderr, one line each in either log format); stdout,
which a terminal shows beside it, carries only what a person or a script waits for:

    sr: listening on http://127.0.0.1:8899 (starting; /ready answers 503 until ready)
    sr: serving on http://127.0.0.1:8899: 1/2 replicas of primary ready
    sr: all replicas ready (2/2)

With several deployments, the serving line is followed by each deployment's own base URL
(`/d/<deployment>/`), where clients that send no `model` are pointed.

The serving line comes once every deployment has a ready replica (what /ready means) and
counts the ready replicas of each; the all-ready line comes once, as soon as every replica
of every deployment is ready: right after the serving line after a full start, later
(on the replica state change that completes the set) after a partial one.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

import attrs

from sr.router.app import deployment_base_path

if TYPE_CHECKING:
    from sr.pool.views import Inventory


@attrs.frozen
class ReplicaCount:
    deployment: str
    ready: int
    desired: int


def replica_counts(inventory: Inventory) -> list[ReplicaCount]:
    """Ready and desired replicas of each deployment, from a pool inventory."""
    return [
        ReplicaCount(name, deployment.ready_replicas, deployment.desired_replicas)
        for name, deployment in inventory.deployments.items()
    ]


def serving_line(url: str, counts: list[ReplicaCount]) -> str:
    """`sr: serving on URL: 1/2 replicas of primary ready` (`, 1/1 of rerank` per more)."""
    if not counts:
        return f"sr: serving on {url}"
    first, *rest = counts
    parts = [f"{first.ready}/{first.desired} replicas of {first.deployment}"]
    parts += [f"{c.ready}/{c.desired} of {c.deployment}" for c in rest]
    return f"sr: serving on {url}: {', '.join(parts)} ready"


def all_ready(counts: list[ReplicaCount]) -> bool:
    return bool(counts) and all(c.desired > 0 and c.ready >= c.desired for c in counts)


class StartupProgress:
    def __init__(self, out: TextIO | None = None):
        self._out = out or sys.stdout
        self._counts: Callable[[], list[ReplicaCount]] | None = None
        self.all_ready_printed = False

    def listening(self, url: str) -> None:
        self._print(f"sr: listening on {url} (starting; /ready answers 503 until ready)")

    def ready(self, url: str, counts: Callable[[], list[ReplicaCount]]) -> None:
        """The router is ready; `counts` reads the live replica counts from now on."""
        self._counts = counts
        now = counts()
        self._print(serving_line(url, now))
        if len(now) > 1:  # clients that send no `model` (TEI's, Cohere's) need one of these
            urls = ", ".join(url + deployment_base_path(c.deployment) for c in now)
            self._print(f"sr: each deployment's own base URL: {urls}")
        self._check_all_ready()

    def on_event(self, event: str, fields: dict[str, Any]) -> None:
        if event == "replica_state" and self._counts is not None:
            self._check_all_ready()

    def _check_all_ready(self) -> None:
        if self.all_ready_printed or self._counts is None:
            return
        counts = self._counts()
        if all_ready(counts):
            self.all_ready_printed = True
            total = sum(c.desired for c in counts)
            self._print(f"sr: all replicas ready ({total}/{total})")

    def _print(self, line: str) -> None:
        print(line, file=self._out, flush=True)
