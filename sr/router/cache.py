"""Router-side result cache for single-worker deployments.

A deterministic encoder gives the same answer to the same request, so a single-worker
deployment can answer repeats without a forward. The key is the route plus the canonical
JSON of the body the worker gets, `model` included: the answer names what the request
named (the deployment or its artifact, sr.worker.served_as), so the two names are two
entries. A deadline travels in a header and is not part of it. Only 200 answers are kept.
Any change of the deployment's readiness clears its entries, because a restarted or
replaced worker may hold different weights. Multi-replica deployments bypass the cache:
each worker keeps its own, and a router-side copy would hide which replica answered.

Pure: no I/O and no clock.
"""

from __future__ import annotations

import json
from typing import Any

from sr.lru import LruCache


def cache_key(path: str, body: dict[str, Any]) -> str:
    """The route plus the canonical JSON of the body."""
    return path + "\n" + json.dumps(body, sort_keys=True, separators=(",", ":"))


class ResultCache:
    """Per-deployment LRU caches of worker answer bodies, for single-worker deployments."""

    def __init__(self, max_entries: int):
        self.max_entries = max_entries
        self._by_deployment: dict[str, LruCache[str, bytes]] = {}
        self.hits = 0
        self.misses = 0

    def configure(self, replicas_by_deployment: dict[str, int]) -> None:
        """Enable caching for exactly the single-worker deployments; drops every entry."""
        self._by_deployment = {
            name: LruCache(self.max_entries)
            for name, replicas in replicas_by_deployment.items()
            if replicas == 1 and self.max_entries > 0
        }

    def enabled_for(self, deployment: str) -> bool:
        return deployment in self._by_deployment

    def get(self, deployment: str, key: str) -> bytes | None:
        cache = self._by_deployment.get(deployment)
        if cache is None:
            return None
        value = cache.get(key)
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
        return value

    def put(self, deployment: str, key: str, status: int, body: bytes) -> bool:
        """Keep `body` if the deployment caches and the answer is a 200; True if kept."""
        cache = self._by_deployment.get(deployment)
        if cache is None or status != 200:
            return False
        cache.put(key, body)
        return True

    def clear(self, deployment: str) -> None:
        cache = self._by_deployment.get(deployment)
        if cache is not None:
            cache.clear()

    def entries(self, deployment: str) -> int:
        cache = self._by_deployment.get(deployment)
        return 0 if cache is None else len(cache)

    def on_event(self, event: str, fields: dict[str, Any]) -> None:
        """EventSink listener: a replica state change is a readiness change."""
        if event == "replica_state":
            deployment = fields.get("deployment")
            if isinstance(deployment, str):
                self.clear(deployment)
