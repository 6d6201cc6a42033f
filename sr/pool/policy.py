"""DeploymentPolicy: dispatch, admission and outcome accounting for one deployment (pure).

Dispatch picks, among dispatchable replicas with a free slot, the one with the fewest
outstanding request bytes, ties to the least recently assigned (a router-wide sequence
passed in, so it survives reloads). Choice and reservation happen in one synchronous call:
no await can slip between them, so admission never overshoots `MAX_INFLIGHT`.

There is no queue: when every ready replica is full the caller gets `Overloaded`; when
none is ready (all in backoff, starting, failed, ...) `Unavailable`; when ready replicas
exist but all are backing off, that `Unavailable` says so and carries `Retry-After`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from sr.config.schema import OutlierDetection
from sr.errors import Overloaded, Unavailable
from sr.events import EventSink
from sr.pool import ejection
from sr.pool.changes import StateChanges
from sr.pool.outcome import Outcome
from sr.pool.record import ReplicaRecord
from sr.pool.service_times import ServiceTimes
from sr.pool.state import ReplicaState, check_transition, is_dropped

MAX_INFLIGHT = 32
# Outcomes that say nothing about the replica: they neither count nor reset.
_NEUTRAL = frozenset({Outcome.REJECTED, Outcome.CANCELED, Outcome.SHORT_DEADLINE})


class Reservation:
    """One admitted request on one replica, since `started`; released exactly once."""

    __slots__ = ("cost", "record", "released", "started")

    def __init__(self, record: ReplicaRecord, cost: int, started: float) -> None:
        self.record = record
        self.cost = cost
        self.started = started
        self.released = False


class DeploymentPolicy:
    def __init__(
        self,
        name: str,
        *,
        next_sequence: Callable[[], int],
        outlier: OutlierDetection | None = None,
        events: EventSink | None = None,
        max_inflight: int = MAX_INFLIGHT,
        changes: StateChanges | None = None,
    ) -> None:
        """`changes` is notified of every change a task may wait for (sr.pool.changes)."""
        self.name = name
        self.records: list[ReplicaRecord] = []
        self.outlier = outlier or OutlierDetection()
        self.events = events or EventSink(log=False)
        self.max_inflight = max_inflight
        self.changes = changes or StateChanges()
        self._next_sequence = next_sequence
        self._mark = 0  # counts outcomes; orders ok answers against timeout streaks
        self.service_times = ServiceTimes()  # healthy answers' durations, by request size

    # -- membership -----------------------------------------------------------------
    def publish(self, records: list[ReplicaRecord], outlier: OutlierDetection) -> None:
        """Replace the dispatchable set atomically (a reload)."""
        self.records = list(records)
        self.outlier = outlier
        self.changes.notify()

    # -- dispatch -------------------------------------------------------------------
    def reserve(self, nbytes: int, now: float) -> Reservation:
        cap = self.max_inflight
        best = None
        for rec in self.records:
            if rec.blocked_until > now or rec.inflight >= cap:
                continue
            if (
                best is None
                or rec.outstanding_bytes < best.outstanding_bytes
                or (
                    rec.outstanding_bytes == best.outstanding_bytes
                    and rec.last_assigned < best.last_assigned
                )
            ):
                best = rec
        if best is None:
            best = self._fallback(now)
        cost = nbytes if nbytes > 1 else 1
        best.inflight += 1
        best.outstanding_bytes += cost
        best.last_assigned = self._next_sequence()
        return Reservation(best, cost, now)

    def _fallback(self, now: float) -> ReplicaRecord:
        """Slow path: an ejected replica (rule 7), else say why nothing can serve."""
        ejected = [
            r
            for r in self.records
            if r.lifecycle is ReplicaState.READY
            and not r.retired
            and r.is_ejected(now)
            and now >= r.backoff.until
        ]
        free = [r for r in ejected if r.inflight < self.max_inflight]
        if free:
            return min(free, key=lambda r: (r.outstanding_bytes, r.last_assigned))
        serving = [
            r
            for r in self.records
            if r.lifecycle is ReplicaState.READY and not r.retired and now >= r.backoff.until
        ]
        if serving:
            raise Overloaded(
                f"deployment {self.name!r}: every ready replica has "
                f"{self.max_inflight} requests in flight"
            )
        backing_off = [
            r.backoff.until
            for r in self.records
            if r.lifecycle is ReplicaState.READY and not r.retired and now < r.backoff.until
        ]
        if backing_off:
            wait = min(backing_off) - now
            raise Unavailable(
                f"deployment {self.name!r}: every ready replica is backing off after "
                f"failures (next in {wait:.1f}s)",
                headers={"Retry-After": str(max(1, math.ceil(wait)))},
            )
        raise Unavailable(f"deployment {self.name!r} has no ready replica")

    # -- outcomes -------------------------------------------------------------------
    def deadline_outcome(self, res: Reservation, deadline: float, own_deadline: bool) -> Outcome:
        """What a deadline that fired on `res` says about its replica: the deployment's own
        `timeout_ms` always counts; a caller's deadline counts only if a healthy replica
        could have met it (sr.pool.service_times)."""
        if own_deadline:
            return Outcome.TIMEOUT
        floor_s = self.outlier.min_deadline_ms / 1000
        if self.service_times.deadline_counts(res.cost, deadline - res.started, floor_s):
            return Outcome.TIMEOUT
        return Outcome.SHORT_DEADLINE

    def release(self, res: Reservation, outcome: Outcome, now: float) -> bool:
        """Account for one finished exchange. True after a failure or timeout of a serving
        replica: a /health probe should run, and a backoff or ejection may have begun."""
        if res.released:
            return False
        res.released = True
        rec = res.record
        rec.inflight -= 1
        rec.outstanding_bytes -= res.cost
        self.changes.notify()  # a drain waits for in-flight requests to end
        if rec.retired or outcome in _NEUTRAL:
            return False
        self._mark += 1
        probe = False
        if outcome is Outcome.OK:
            self.service_times.observe(res.cost, now - res.started)
            rec.backoff.ok()
            if ejection.on_ok(rec, self._mark, now):
                self.events.emit(
                    "replica_readmitted", deployment=self.name, replica=rec.id, reason="ok"
                )
        else:  # FAILED or TIMEOUT
            rec.backoff.bad_outcome(now)
            probe = True
            if outcome is Outcome.TIMEOUT:
                ejection.on_timeout(rec, self._mark)
                self._consider_ejection(rec, now)
        rec.recompute_blocked()
        self.note_state(rec, now)
        return probe

    def _consider_ejection(self, rec: ReplicaRecord, now: float) -> None:
        if not ejection.should_try(self.outlier, rec, now):
            return
        rule = ejection.withheld_rule(self.outlier, rec, self.records, now)
        if rule is not None:
            self.events.emit(
                "replica_ejection_withheld", deployment=self.name, replica=rec.id, rule=rule
            )
            return
        duration = ejection.eject(self.outlier, rec, now)
        self.events.emit(
            "replica_ejected",
            deployment=self.name,
            replica=rec.id,
            duration_ms=duration,
            ejections=rec.ejections,
        )

    # -- lifecycle ------------------------------------------------------------------
    def set_lifecycle(
        self, rec: ReplicaRecord, new: ReplicaState, now: float, reason: str | None = None
    ) -> None:
        if is_dropped(rec.lifecycle, new):  # a retired replica's late report
            return
        if check_transition(rec.lifecycle, new, attached=rec.attached) or reason != rec.reason:
            if rec.lifecycle is ReplicaState.READY and new is not ReplicaState.READY:
                rec.restart.left_ready(now)
            rec.lifecycle = new
            rec.reason = reason
            if new is ReplicaState.READY:
                rec.early_exits = 0
                rec.restart.became_ready(now)
            rec.recompute_blocked()
            self.changes.notify()
        self.note_state(rec, now)

    def refresh(self, now: float) -> None:
        """Emit state changes that happened by time alone (backoff or ejection ended)."""
        for rec in self.records:
            self.note_state(rec, now)

    def note_state(self, rec: ReplicaRecord, now: float) -> None:
        """Report `rec`'s state if it changed since last reported. Whoever notices first
        that a cooldown ended (the timer task, or the prober setting the lifecycle at the
        same moment) reports the readmission: it is one event, not the timer's alone."""
        state = rec.state(now)
        if state is not rec.reported_state:
            if (
                rec.reported_state is ReplicaState.EJECTED
                and rec.on_probation
                and not rec.is_ejected(now)
            ):
                self.events.emit(
                    "replica_readmitted",
                    deployment=self.name,
                    replica=rec.id,
                    reason="cooldown",
                )
            rec.reported_state = state
            self.events.emit(
                "replica_state",
                deployment=self.name,
                replica=rec.id,
                state=state.value,
                reason=rec.reason,
            )

    def next_wakeup(self, now: float) -> float | None:
        """The earliest future time at which some replica's overlay ends."""
        times = [
            t for rec in self.records for t in (rec.backoff.until, rec.ejected_until) if t > now
        ]
        return min(times) if times else None
