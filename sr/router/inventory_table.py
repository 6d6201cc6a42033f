"""The `sr inventory` table: deployments and their replicas, as aligned text.

Pure: takes an inventory (sr.pool.views, as GET /api/v1/inventory/model-runtime serves it)
and returns lines.
"""

from __future__ import annotations

from typing import Any

from sr.pool.state import ReplicaState
from sr.pool.views import DiscoveryView, Inventory

COLUMNS = (
    "DEPLOYMENT", "REPLICA", "PLACEMENT", "STATE", "INFLIGHT", "OUTSTANDING_B", "RESTARTS",
    "EJECTIONS", "THREADS", "REASON",
)  # fmt: skip
_COLOURS = {
    "ready": "32",  # green
    "degraded": "33",
    "backoff": "33",  # yellow: working, but something is off
    "starting": "36",
    "loading": "36",
    "warming": "36",
    "restarting": "36",  # cyan: on its way
    "draining": "35",
    "ejected": "31",
    "incompatible": "31",
    "failed": "31",
    "unreachable": "31",
    "unavailable": "31",  # red
}


def colour(state: str, enabled: bool) -> str:
    code = _COLOURS.get(state)
    return f"\x1b[{code}m{state}\x1b[0m" if enabled and code else state


def _cell(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def render_inventory(inventory: Inventory, *, colour_states: bool = False) -> list[str]:
    rows: list[tuple[list[str], int]] = []  # cells, index of the state cell
    summaries: list[str] = []
    for name, deployment in inventory.deployments.items():
        summaries.append(
            f"{name}: {colour(deployment.state, colour_states)} "
            f"{deployment.ready_replicas}/{deployment.desired_replicas}"
            f" ready, {deployment.restarts} restarts"
        )
        summaries += [f"  {discovery_summary(entry)}" for entry in deployment.discovery or ()]
        for replica in deployment.replicas:
            state_text = replica.state.value
            if replica.state is ReplicaState.EJECTED and replica.ejected_for_ms is not None:
                state_text += f" {replica.ejected_for_ms / 1000:.0f}s"
            cells = [
                name,
                replica.id,
                _cell(replica.placement),
                state_text,
                _cell(replica.inflight),
                _cell(replica.outstanding_bytes),
                _cell(replica.restarts),
                _cell(replica.ejections),
                _cell(replica.threads),
                _cell(replica.reason),
            ]
            rows.append((cells, 3))
    widths = [len(c) for c in COLUMNS]
    for cells, _ in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, cells, strict=True)]
    lines = [*summaries, ""] if summaries else ["no deployments"]
    lines.append("  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True)).rstrip())
    for cells, state_index in rows:
        padded = [c.ljust(w) for c, w in zip(cells, widths, strict=True)]
        if colour_states:
            state = cells[state_index].split(" ")[0]
            padded[state_index] = padded[state_index].replace(state, colour(state, True), 1)
        lines.append("  ".join(padded).rstrip())
    return lines


def discovery_summary(entry: DiscoveryView) -> str:
    """One line about a discover entry: its set and its last resolution."""
    members = sum(1 for row in entry.discovered if row.status == "member")
    text = f"discover {entry.discover}: {members}/{len(entry.discovered)} joined"
    pending = [f"{row.address} {row.status}" for row in entry.discovered if row.status != "member"]
    if pending:
        text += f" ({', '.join(pending)})"
    last = entry.last_resolution
    if last is None:
        return text + "; not resolved yet"
    text += f"; resolved {last.age_s:.0f}s ago ({last.at}), {last.count} address(es)"
    if last.error:
        good = entry.last_good_resolution
        kept = f", keeping the set of {good.at}" if good else ""
        text += f": FAILED {last.error}{kept}"
    return text
