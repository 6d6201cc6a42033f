"""Replica identity: what makes a worker "the same worker" across a reload.

identity = short hash of (deployment name, placement (device or endpoint), occurrence
ordinal of that placement within the deployment, engine args). Bindings are not part of it,
so changing them restarts nothing, and the single-worker shorthand maps to the same
identity as one explicit replica (both come out of `Deployment.placements()`).
"""

from __future__ import annotations

import hashlib
import json

from sr.config.schema import DEFAULT_DTYPE, DEFAULT_KERNEL, Deployment, Replica


def placement_label(replica: Replica) -> str:
    return replica.endpoint if replica.endpoint is not None else (replica.device or "cpu")


def engine_args(deployment: Deployment, threads: int | None) -> dict:
    args = {
        "artifact": deployment.artifact,
        "revision": deployment.revision,
        "profile": deployment.profile,
        "max_tokens": deployment.input.max_tokens,
        "overflow": deployment.input.overflow,
        "max_num_seqs": deployment.max_num_seqs,
        "max_num_batched_tokens": deployment.max_num_batched_tokens,
        "threads": threads,
    }
    # Only when not the default, so the identities of float32 replicas (every replica
    # before dtype existed) stay what they were and a reload does not restart them.
    if deployment.dtype != DEFAULT_DTYPE:
        args["dtype"] = deployment.dtype
    if deployment.kernel != DEFAULT_KERNEL:
        args["kernel"] = deployment.kernel
    return args


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
