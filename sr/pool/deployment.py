"""DeploymentPool: one deployment's replica tasks, its dispatch with deadlines, its timers.

A dispatch reserves a replica synchronously (sr.pool.policy), then runs the exchange in a
cancel scope whose deadline is min(caller deadline, `timeout_ms`; 30 s without one). The
scope firing is a `timeout` when the deadline was `timeout_ms`, or a caller's deadline a
healthy replica could have met (sr.pool.service_times); a shorter caller deadline is
`short_deadline`, which answers 504 and counts for nothing. A caller that went away is
`canceled`: noticed either by a cancellation from outside, or by the caller's `watch`
(sr.http.hang_up's extension), which cancels the attempt's own scope before its deadline,
and the dispatch raises ClientDisconnected. Watching the scope the attempt already has
spares the router a second cancel scope per request (about 50,000 instructions,
bench/bench_request_instructions.py). Whatever happens, the reservation is released
exactly once, after the response body was read.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import trio

from sr.config.schema import DEFAULT_TIMEOUT_MS, Deployment
from sr.error_answer import read_error_answer
from sr.errors import DeadlineExceeded, Overloaded, TransportError, Unavailable, WorkerFailed
from sr.http.body import ClientDisconnected
from sr.http.hop import Hop
from sr.pool.discovery import DiscoveryGroup
from sr.pool.outcome import Outcome, no_answer, outcome_of_status, outcome_of_transport_error
from sr.pool.policy import DeploymentPolicy
from sr.pool.replica import ReplicaRunner
from sr.pool.state import ReplicaState, is_terminal
from sr.pool.views import DeploymentState, DeploymentView

if TYPE_CHECKING:
    from sr.pool.dispatch_trace import DispatchTrace

# Watches a cancel scope for the caller hanging up: cancels it then; returns the function
# that stops watching (sr.http.hang_up's `watch`).
HangUpWatch = Callable[[trio.CancelScope], Callable[[], None]]


@attrs.frozen
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    replica_id: str


class DeploymentPool:
    def __init__(self, name: str, config: Deployment, policy: DeploymentPolicy) -> None:
        self.name = name
        self.config = config
        self.policy = policy
        # The replicas a reload publishes (device and endpoint entries), and the discovery
        # groups (discover entries, sr.pool.discovery) that publish their own as they go.
        self.static_runners: dict[str, ReplicaRunner] = {}
        self.groups: dict[str, DiscoveryGroup] = {}
        self.runners: dict[str, ReplicaRunner] = {}  # published replicas, by identity
        self.cancel_scope = trio.CancelScope()
        self._nursery: trio.Nursery | None = None
        self._poke = trio.Event()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with self.cancel_scope:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery  # the replicas' tasks run here
                task_status.started()
                await self._timers()  # for ever

    async def start_runner(self, runner: ReplicaRunner) -> None:
        assert self._nursery is not None
        await self._nursery.start(runner.run)

    async def start_group(self, group: DiscoveryGroup) -> None:
        assert self._nursery is not None
        await self._nursery.start(group.run)

    def publish(
        self,
        config: Deployment,
        runners: dict[str, ReplicaRunner],
        groups: dict[str, DiscoveryGroup] | None = None,
    ) -> None:
        self.config = config
        self.static_runners = dict(runners)
        self.groups = dict(groups or {})
        self.recompose()

    def recompose(self) -> None:
        """Publish the static replicas plus every group's current members at once (a
        reload, or a discovery group's membership change)."""
        runners = dict(self.static_runners)
        for group in self.groups.values():
            runners.update(group.published())
        self.runners = runners
        self.policy.publish([r.record for r in runners.values()], self.config.outlier_detection)
        self._poke.set()

    # -- dispatch -------------------------------------------------------------------
    async def request_raw(
        self,
        path: str,
        body: bytes,
        timeout_s: float | None,
        request_id: str | None = None,
        watch: HangUpWatch | None = None,
        trace: DispatchTrace | None = None,
    ) -> Reply:
        """Dispatch one request. A worker that gave no HTTP answer at all (it died, or its
        connection broke) is retried once on another replica within the same deadline:
        inference is idempotent, and the caller would otherwise see the crash. That holds in
        every transport phase (sr.errors.TransportError), even once the request was written.
        ClientDisconnected when `watch` saw the caller hang up. `trace`: the request's spans
        (sr.pool.dispatch_trace), only when traces are on."""
        if trace is None:
            return await self._dispatch(path, body, timeout_s, request_id, watch, None)
        with trace.dispatching(self.name):
            return await self._dispatch(path, body, timeout_s, request_id, watch, trace)

    async def _dispatch(
        self,
        path: str,
        body: bytes,
        timeout_s: float | None,
        request_id: str | None,
        watch: HangUpWatch | None,
        trace: DispatchTrace | None,
    ) -> Reply:
        now = trio.current_time()
        deadline = math.inf if timeout_s is None else now + timeout_s
        timeout_ms = self.config.timeout_ms
        own = now + (DEFAULT_TIMEOUT_MS if timeout_ms is None else timeout_ms) / 1000
        own_deadline = own <= deadline  # the deployment's `timeout_ms` is the one in force
        if own_deadline:
            deadline = own
        first = await self._attempt(path, body, deadline, own_deadline, request_id, watch, trace)
        if isinstance(first, Reply):
            return first
        if trio.current_time() >= deadline:
            raise first
        if trace is not None:
            trace.retrying(first)
        try:
            second = await self._attempt(
                path, body, deadline, own_deadline, request_id, watch, trace
            )
        except (Unavailable, Overloaded):
            raise first from None  # nothing else could take it: the crash is the truer answer
        if isinstance(second, Reply):
            return second
        raise second

    async def _attempt(
        self,
        path: str,
        body: bytes,
        deadline: float,
        own_deadline: bool,
        request_id: str | None,
        watch: HangUpWatch | None,
        trace: DispatchTrace | None = None,
    ) -> Reply | WorkerFailed:
        """The replica's answer, or (returned, not raised) the error for a replica that
        gave no HTTP answer at all, which the caller may retry elsewhere. A deadline that
        fires counts against the replica only as `policy.deadline_outcome` rules."""
        if trace is None:
            res = self.policy.reserve(len(body), trio.current_time())
            span = traceparent = None
        else:  # the worker's spans join the trace (sr.worker.tracing)
            res = trace.admit(lambda: self.policy.reserve(len(body), trio.current_time()))
            span = trace.hop(str(res.record.id), path)
            traceparent = span.traceparent
        rec = res.record
        runner = self.runners.get(rec.id)
        transport = runner.transport if runner is not None else None
        outcome = Outcome.CANCELED
        failure: BaseException | None = None
        try:
            if transport is None:
                outcome = Outcome.REJECTED  # refused before sending
                raise Unavailable(f"replica {rec.id} of {self.name!r} has no connection")
            with trio.move_on_at(deadline) as scope:
                stop_watching = watch(scope) if watch is not None else None
                try:
                    status, headers, payload = await transport.exchange(
                        "POST", path, body, Hop(request_id, self.name, traceparent)
                    )
                except TransportError as error:
                    outcome = outcome_of_transport_error(error)
                    failure = no_answer(error, rec.id, self.name)
                    return failure
                finally:
                    if stop_watching is not None:
                        stop_watching()
                outcome = outcome_of_status(status)
            if scope.cancelled_caught and trio.current_time() < deadline:
                raise ClientDisconnected("the caller hung up")  # `watch` cancelled the scope
            if scope.cancelled_caught:
                outcome = self.policy.deadline_outcome(res, deadline, own_deadline)
                raise DeadlineExceeded(
                    f"deployment {self.name!r}: no answer from replica {rec.id} within the deadline"
                )
        except BaseException as error:
            failure = error
            raise
        finally:
            if self.policy.release(res, outcome, trio.current_time()):
                # A failure or a timeout: a backoff or an ejection may have begun, so the
                # timers re-plan. Other outcomes never bring a wake-up forward (a success
                # only ends overlays early, and `_timers` waking at a stale time is a
                # no-op), so the common path wakes no second task.
                if runner is not None:
                    runner.request_probe()
                for group in self.groups.values():
                    group.replica_failed(rec.id)  # a discovered fleet may have moved
                self._poke.set()
            if span is not None:
                if failure is None:
                    span.answered(status, outcome.value)
                else:
                    span.failed(failure, outcome.value)
                span.end()
        if outcome is Outcome.FAILED:
            reason = read_error_answer(payload).message
            raise WorkerFailed(f"replica {rec.id} of {self.name!r} answered {status}: {reason}")
        return Reply(status, headers, payload, rec.id)

    async def _timers(self) -> None:
        """Emit state changes that happen by time alone (end of backoff or ejection)."""
        while True:
            wake = self.policy.next_wakeup(trio.current_time())
            with trio.move_on_at(math.inf if wake is None else wake):
                await self._poke.wait()
            self._poke = trio.Event()
            self.policy.refresh(trio.current_time())

    # -- views ----------------------------------------------------------------------
    def snapshot(self, now: float) -> DeploymentView:
        rows = tuple(r.record.snapshot(now) for r in self.runners.values())
        ready = sum(1 for row in rows if row.state in _SERVING)
        # A discover entry stands for as many replicas as its name resolved to.
        desired = sum(1 for p in self.config.placements() if not p.discovered)
        desired += sum(group.desired() for group in self.groups.values())
        state: DeploymentState
        if ready and ready >= desired:
            state = "ready"
        elif ready:
            state = "degraded"
        elif any(row.state in _ON_ITS_WAY for row in rows):
            state = "starting"
        else:
            state = "unavailable"
        discovery = tuple(group.snapshot(now) for group in self.groups.values())
        return DeploymentView(
            artifact=self.config.artifact,
            desired_replicas=desired,
            ready_replicas=ready,
            state=state,
            restarts=sum(row.restarts for row in rows),
            replicas=rows,
            discovery=discovery or None,
            prompts=self._prompts(),
        )

    def _prompts(self) -> dict | None:
        """The prompts of a ready replica's card (every replica serves the same folder)."""
        for runner in self.runners.values():
            card = runner.record.card
            if runner.record.lifecycle is ReplicaState.READY and card:
                return card.get("prompts")
        return None

    def has_ready(self) -> bool:
        return any(r.record.lifecycle is ReplicaState.READY for r in self.runners.values())

    def all_terminal(self) -> bool:
        """Every replica is terminal (attached ones never are: sr.pool.state)."""
        return bool(self.runners) and all(
            is_terminal(r.record.lifecycle, attached=r.record.attached)
            for r in self.runners.values()
        )


_SERVING = frozenset({ReplicaState.READY, ReplicaState.BACKOFF})
_ON_ITS_WAY = frozenset(
    {ReplicaState.STARTING, ReplicaState.LOADING, ReplicaState.WARMING, ReplicaState.RESTARTING}
)
