"""Replica identity: what makes a worker "the same worker" across a reload.

identity = short hash of (deployment name, placement (device or endpoint), occurrence
ordinal of that placement within the deployment, engine args). Bindings are not part of it,
so changing them restarts nothing, and the single-worker shorthand maps to the same
identity as one explicit replica (both come out of `Deployment.placements()`).
"""

from __future__ import annotations

import hashlib
import json

import attrs

from sr.config.schema import Deployment, Replica


def placement_label(replica: Replica) -> str:
    return replica.endpoint if replica.endpoint is not None else (replica.device or "cpu")


def engine_args(deployment: Deployment, threads: int | None) -> dict:
    # Fields marked omit_if_default (dtype, kernel) only when not the default, so the
    # identities of replicas from before they existed stay what they were and a reload
    # does not restart them (sr.config.engine); unset caps stay in as None, as they were.
    args = attrs.asdict(deployment.engine_args(), filter=_travels)
    args["threads"] = threads
    return args


def _travels(field: attrs.Attribute, value: object) -> bool:
    return not (field.metadata.get("omit_if_default") and value == field.default)


def replica_identities(
    name: str, deployment: Deployment, threads: int | None
) -> list[tuple[str, Replica]]:
    """(identity, placement) for every replica of the deployment, in declared order."""
    seen: dict[str, int] = {}
    out = []
    for replica in deployment.placements():
        label = placement_label(replica)
        ordinal = seen.get(label, 0)
        seen[label] = ordinal + 1
        key = {
            "deployment": name,
            "placement": label,
            "model": replica.model,
            "ordinal": ordinal,
            # attached workers manage their own threads: the router's count is no part of them
            "engine": engine_args(deployment, None if replica.attached else threads),
        }
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
        out.append((f"{name}-{digest[:8]}", replica))
    return out
