"""ReplicaRecord: the router's bookkeeping for one replica (no I/O, no clock of its own).

Everything dispatch and the inventory read about a replica lives here. Mutations go
through `DeploymentPolicy` (sr.pool.policy) so that `blocked_until`, the single number the
hot dispatch loop compares, is recomputed whenever one of its inputs changes.
"""

from __future__ import annotations

import math

from sr.pool.backoff import RequestBackoff, RestartBackoff
from sr.pool.state import ReplicaState, effective_state
from sr.pool.views import ReplicaView

INF = math.inf


class ReplicaRecord:
    def __init__(
        self,
        *,
        replica_id: str,
        deployment: str,
        placement: str,
        attached: bool = False,
        threads: int | None = None,
    ) -> None:
        self.id = replica_id
        self.deployment = deployment
        self.placement = placement  # device ("cpu", "cuda:0") or endpoint URL
        self.attached = attached
        self.threads = threads
        self.pid: int | None = None
        self.reason: str | None = None
        self.card: dict | None = None

        self.lifecycle = ReplicaState.STARTING
        self.backoff = RequestBackoff()
        self.restart = RestartBackoff()
        self.early_exits = 0  # exits in a row without ever becoming ready

        # admission and dispatch
        self.inflight = 0
        self.outstanding_bytes = 0
        self.last_assigned = 0  # router-wide assignment sequence; 0 = never
        self.blocked_until = INF  # dispatchable iff blocked_until <= now

        # outlier ejection (sr.pool.ejection)
        self.consecutive_timeouts = 0
        self.streak_mark = 0  # outcome mark of the first timeout of the current streak
        self.last_ok_mark = 0  # outcome mark of this replica's latest ok
        self.ejected_until = -INF
        self.ejections = 0  # total, for the inventory
        self.ejection_level = 0  # doubling step; reset by ok
        self.on_probation = False

        self.reported_state: ReplicaState | None = None
        self.retired = False

    def recompute_blocked(self) -> None:
        if self.lifecycle is ReplicaState.READY and not self.retired:
            self.blocked_until = max(self.backoff.until, self.ejected_until)
        else:
            self.blocked_until = INF

    def state(self, now: float) -> ReplicaState:
        return effective_state(self.lifecycle, now, self.backoff.until, self.ejected_until)

    def is_ejected(self, now: float) -> bool:
        return now < self.ejected_until

    def snapshot(self, now: float) -> ReplicaView:
        state = self.state(now)
        adaptive = (self.card or {}).get("adaptive_threads")
        ejected = state is ReplicaState.EJECTED
        return ReplicaView(
            id=self.id,
            device=None if self.attached else self.placement,
            endpoint=self.placement if self.attached else None,
            state=state,
            ready=state is ReplicaState.READY,
            inflight=self.inflight,
            outstanding_bytes=self.outstanding_bytes,
            restarts=self.restart.restarts,
            consecutive_timeouts=self.consecutive_timeouts,
            ejections=self.ejections,
            threads=self.threads,
            pid=self.pid,
            reason=self.reason,
            adaptive_threads=adaptive if adaptive and adaptive.get("mode") else None,
            ejected_for_ms=max(0, round((self.ejected_until - now) * 1000)) if ejected else None,
        )
