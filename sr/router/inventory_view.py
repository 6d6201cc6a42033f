"""Read-only views over the pool's inventory dict, shared by metrics and `sr inventory`.

The inventory (SPEC section 8) lists deployments with their replicas. These helpers accept
deployments as a mapping `{name: {...}}` or a list of `{name: ..., ...}` so that readers do
not depend on which of the two the pool chose.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def deployments(inventory: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    listed = inventory.get("deployments", {})
    if isinstance(listed, dict):
        for name, deployment in listed.items():
            yield str(name), deployment
    else:
        for deployment in listed:
            yield str(deployment.get("name", deployment.get("id", "?"))), deployment


def replicas(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    listed = deployment.get("replicas", [])
    if isinstance(listed, dict):
        return [{"id": key, **value} for key, value in listed.items()]
    return list(listed)


def replica_id(replica: dict[str, Any]) -> str:
    return str(replica.get("id", replica.get("replica", "?")))


def number(value: Any) -> float:
    """A metric value from an inventory field that may be missing or null."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        return float(value)
    return 0.0
