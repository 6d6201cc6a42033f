"""The `sr inventory` table: deployments and their replicas, as aligned text.

Pure: takes the inventory dict (GET /api/v1/inventory/model-runtime) and returns lines.
"""

from __future__ import annotations

from typing import Any

from sr.router import inventory_view

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


def render_inventory(inventory: dict[str, Any], *, colour_states: bool = False) -> list[str]:
    rows: list[tuple[list[str], int]] = []  # cells, index of the state cell
    summaries: list[str] = []
    for name, deployment in inventory_view.deployments(inventory):
        state = str(deployment.get("state", "?"))
        summaries.append(
            f"{name}: {colour(state, colour_states)} "
            f"{_cell(deployment.get('ready_replicas'))}/{_cell(deployment.get('desired_replicas'))}"
            f" ready, {_cell(deployment.get('restarts', 0))} restarts"
        )
        summaries += [
            f"  {inventory_view.discovery_summary(entry)}"
            for entry in inventory_view.discovery(deployment)
        ]
        for replica in inventory_view.replicas(deployment):
            replica_state = str(replica.get("state", "?"))
            if replica_state == "ejected" and replica.get("ejected_for_ms") is not None:
                replica_state_text = f"{replica_state} {replica['ejected_for_ms'] / 1000:.0f}s"
            else:
                replica_state_text = replica_state
            cells = [
                name,
                inventory_view.replica_id(replica),
                _cell(replica.get("device") or replica.get("endpoint")),
                replica_state_text,
                _cell(replica.get("inflight")),
                _cell(replica.get("outstanding_bytes")),
                _cell(replica.get("restarts")),
                _cell(replica.get("ejections")),
                _cell(replica.get("threads")),
                _cell(replica.get("reason")),
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
