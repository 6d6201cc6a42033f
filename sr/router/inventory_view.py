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


def discovery(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    """The deployment's `discover` entries (sr.pool.discovery), or [] when it has none."""
    listed = deployment.get("discovery") or []
    return [entry for entry in listed if isinstance(entry, dict)]


def discovery_summary(entry: dict[str, Any]) -> str:
    """One line about a discover entry: its set and its last resolution."""
    found = entry.get("discovered") or []
    members = sum(1 for row in found if row.get("status") == "member")
    text = f"discover {entry.get('discover', '?')}: {members}/{len(found)} joined"
    pending = [
        f"{row.get('address')} {row.get('status')}"
        for row in found
        if row.get("status") != "member"
    ]
    if pending:
        text += f" ({', '.join(pending)})"
    last = entry.get("last_resolution")
    if not last:
        return text + "; not resolved yet"
    text += f"; resolved {last.get('age_s', 0):.0f}s ago ({last.get('at')}), {last.get('count')}"
    text += " address(es)"
    if last.get("error"):
        good = entry.get("last_good_resolution")
        kept = f", keeping the set of {good.get('at')}" if good else ""
        text += f": FAILED {last['error']}{kept}"
    return text


def replica_id(replica: dict[str, Any]) -> str:
    return str(replica.get("id", replica.get("replica", "?")))


def number(value: Any) -> float:
    """A metric value from an inventory field that may be missing or null."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        return float(value)
    return 0.0
