"""Discovered fleets of attached workers: a `discover: dns://HOST:PORT` replica entry.

One `DiscoveryGroup` task per entry, in its deployment pool's nursery; it owns one attached
`ReplicaRunner` per resolved address (supervision: pool -> group -> replica). The rules
(Envoy's STRICT_DNS cluster) are pure, in sr.pool.membership; this module is their I/O:

* the name is resolved by an injectable `Resolver` (default: trio's getaddrinfo) when the
  schedule says so (`refresh_s`; sooner after a member's failed request; never more often
  than once a second);
* a new address becomes a *joining* runner, probed like any attached replica; it is
  published into the pool (dispatched to) only once its /health and card checks pass;
* a vanished address is *leaving*: retired with drain like a reload retiring a replica
  (no new work, in-flight requests finish, bounded), then forgotten;
* a failed resolution changes nothing and is recorded; the inventory shows the
  discovered set, the last resolution and the last good one (`snapshot`).

A member's identity is the address and port (plus the entry and the engine args, like any
replica's): the same answer again, in any order, changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlsplit

import trio

from sr.config.schema import Deployment, Replica
from sr.events import EventSink
from sr.pool.changes import StateChanges
from sr.pool.identity import engine_args
from sr.pool.membership import (
    Address,
    Resolution,
    ResolutionSchedule,
    address_text,
    diff_membership,
)
from sr.pool.replica import ReplicaRunner
from sr.pool.state import ReplicaState
from sr.pool.views import DiscoveredAddress, DiscoveryView, MembershipStatus, ResolutionView

S = ReplicaState
RESOLVE_TIMEOUT_S = 5.0


class Resolver(Protocol):
    async def resolve(self, host: str, port: int) -> list[Address]:
        """Every (address, port) the name stands for; raises when it cannot say."""
        ...


class DnsResolver:
    """The system resolver (trio's getaddrinfo: /etc/hosts, DNS), TCP addresses only."""

    async def resolve(self, host: str, port: int) -> list[Address]:
        infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
        return sorted({(str(info[4][0]), int(info[4][1])) for info in infos})


def parse_discover(discover: str) -> tuple[str, int]:
    """(host, port) of a validated `dns://HOST:PORT`."""
    parts = urlsplit(discover)
    assert parts.hostname is not None and parts.port is not None  # sr.config.validate
    return parts.hostname, parts.port


def member_url(scheme: str, address: Address) -> str:
    return f"{scheme}://{address_text(address)}"


def group_key(
    deployment_name: str, entry: Replica, deployment: Deployment, access_fingerprint: str = ""
) -> str:
    """What makes a discovery entry "the same" across a reload: everything but refresh_s
    (changing the period restarts nothing), including the key and CA bundle in force
    (`access_fingerprint`, sr.pool.worker_access: a rotated key replaces the members)."""
    key = {
        "deployment": deployment_name,
        "access": access_fingerprint,
        "discover": entry.discover,
        "model": entry.model,
        "scheme": entry.effective_scheme,
        "api_key_env": entry.api_key_env,
        "ca_bundle": entry.ca_bundle,
        "engine": engine_args(deployment, None),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def member_id(deployment_name: str, key: str, address: Address) -> str:
    """A discovered replica's id: same entry, same address -> same id (like `{name}-{8 hex}`
    of sr.pool.identity)."""
    digest = hashlib.sha256(f"{key}|{address_text(address)}".encode()).hexdigest()
    return f"{deployment_name}-{digest[:8]}"


class DiscoveryGroup:
    def __init__(
        self,
        *,
        deployment_name: str,
        deployment: Deployment,
        entry: Replica,
        key: str,
        resolver: Resolver,
        new_runner: Callable[[str, Replica], ReplicaRunner],
        on_change: Callable[[], None],
        events: EventSink,
        drain_timeout_s: float,
        wall_clock: Callable[[], float] = time.time,
        changes: StateChanges | None = None,
    ) -> None:
        """`new_runner(replica_id, placement)` builds an attached runner; `on_change()` is
        called whenever the published set (members and leaving ones) changes; `changes` is
        notified of each resolution (a reload waits for this group to warm up, and its
        members' policy notifies their state changes: sr.pool.changes)."""
        assert entry.discover is not None
        self.deployment_name = deployment_name
        self.deployment = deployment  # what members serve (their cards are checked against)
        self.entry = entry
        self.key = key
        self.host, self.port = parse_discover(entry.discover)
        self.resolver = resolver
        self.schedule = ResolutionSchedule(entry.effective_refresh_s)
        self.members: dict[Address, ReplicaRunner] = {}
        self.joining: dict[Address, ReplicaRunner] = {}
        self.leaving: dict[Address, ReplicaRunner] = {}
        self.last: Resolution | None = None
        self.last_good: Resolution | None = None
        self.discovered: tuple[Address, ...] = ()  # the last good resolution's set
        self.cancel_scope = trio.CancelScope()
        self._new_runner = new_runner
        self._on_change = on_change
        self._events = events
        self._drain_timeout_s = drain_timeout_s
        self._wall_clock = wall_clock
        self._changes = changes or StateChanges()
        self._loop_scope = trio.CancelScope()
        self._poke = trio.Event()
        self._nursery: trio.Nursery | None = None

    # -- the pool's view -------------------------------------------------------------
    def published(self) -> dict[str, ReplicaRunner]:
        """Runners the pool lists: members (dispatched to) and leaving ones (draining)."""
        return {r.record.id: r for r in [*self.members.values(), *self.leaving.values()]}

    def desired(self) -> int:
        """Addresses the last good resolution returned (members and joining ones)."""
        return len(self.members) + len(self.joining)

    def is_warm(self) -> bool:
        """Resolved at least once, and every address of it has joined. By the addresses,
        not by `joining` being empty: a resolution lists its new addresses as joining one
        by one (each after its runner started), and is not warm in between."""
        return self.last_good is not None and all(a in self.members for a in self.discovered)

    def warm_failure(self) -> str | None:
        """Why this entry cannot warm up now (a reload adding it fails), or None."""
        if self.last is not None and self.last_good is None:
            return f"resolving {self.entry.discover} failed: {self.last.error}"
        for address, runner in self.joining.items():
            rec = runner.record
            if rec.lifecycle in (S.FAILED, S.INCOMPATIBLE):
                why = f" ({rec.reason})" if rec.reason else ""
                return f"{address_text(address)} is {rec.lifecycle.value}{why}"
        return None

    def describe(self) -> str:
        """One line for error messages: the last resolution and who has not joined."""
        last = self.last
        if last is None:
            return "not resolved yet"
        if last.error is not None:
            return f"last resolution failed: {last.error}"
        joining = ", ".join(
            f"{runner.placement.endpoint} {runner.record.lifecycle.value}"
            + (f" ({runner.record.reason})" if runner.record.reason else "")
            for runner in self.joining.values()
        )
        return f"{last.count} address(es), {len(self.members)} joined" + (
            f"; joining: {joining}" if joining else ""
        )

    def replica_failed(self, replica_id: str) -> None:
        """A request to `replica_id` failed: if it is ours, resolve again soon."""
        if any(r.record.id == replica_id for r in self.members.values()):
            self.schedule.replica_failed(trio.current_time())
            self._poke.set()

    def update(self, entry: Replica, deployment: Deployment) -> None:
        """A reload kept this entry: only refresh_s and fields outside the identity (such
        as outlier detection) may differ."""
        self.entry = entry
        self.deployment = deployment
        for runner in [*self.members.values(), *self.joining.values()]:
            runner.deployment = deployment
        self.schedule.set_refresh(entry.effective_refresh_s)
        self._poke.set()

    def request_resolution(self) -> None:
        """Resolve as soon as the once-a-second bound allows."""
        self.schedule.replica_failed(trio.current_time())
        self._poke.set()

    # -- tasks -----------------------------------------------------------------------
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with self.cancel_scope:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery  # the members' tasks run here
                task_status.started()
                await self._resolve_loop()  # until stopped; the members drain after it

    async def retire(self, drain_timeout_s: float) -> None:
        """Stop resolving; drain every member, drop joining ones; then end the task."""
        self._loop_scope.cancel()
        async with trio.open_nursery() as nursery:
            for runner in [*self.members.values(), *self.leaving.values()]:
                nursery.start_soon(runner.retire, drain_timeout_s)
            for runner in self.joining.values():
                nursery.start_soon(runner.retire, 0)
        self.cancel_scope.cancel()

    async def _resolve_loop(self) -> None:
        with self._loop_scope:
            while True:
                with trio.move_on_at(self.schedule.next_due()):
                    await self._poke.wait()
                self._poke = trio.Event()
                if self.schedule.is_due(trio.current_time()):
                    await self.resolve_once()

    async def resolve_once(self) -> None:
        """One resolution, applied: joins and leaves, or (on failure) nothing but a note."""
        try:
            await self._resolve_and_apply()
        finally:
            self._changes.notify()  # warm, or why not (`is_warm`, `warm_failure`)

    async def _resolve_and_apply(self) -> None:
        addresses: list[Address] = []
        error = None
        with trio.move_on_after(RESOLVE_TIMEOUT_S) as scope:
            try:
                answer = await self.resolver.resolve(self.host, self.port)
                addresses = [(str(host), int(port)) for host, port in answer]
            except Exception as exc:  # any failure keeps the last good set; it is reported
                error = f"{type(exc).__name__}: {exc}".rstrip(": ")
        if scope.cancelled_caught:
            error = f"no answer within {RESOLVE_TIMEOUT_S:g}s"
        unique = sorted(set(addresses))
        if error is None and not unique:
            error = "resolved to no address"
        now = trio.current_time()
        self.last = Resolution(at=now, wall_time=self._wall_clock(), count=len(unique), error=error)
        self.schedule.resolved(now, ok=error is None)
        if error is not None:
            self._emit("discovery_failed", error=error, kept=len(self.members) + len(self.joining))
            return
        self.last_good = self.last
        self.discovered = tuple(unique)
        # An address still draining from an earlier leave joins again once that is done
        # (`_leave`): two runners with one identity would be one too many.
        diff = diff_membership([*self.members, *self.joining], unique)
        joining = [a for a in diff.joining if a not in self.leaving]
        if diff.unchanged:
            return
        self._emit(
            "discovery_changed",
            joining=[address_text(a) for a in diff.joining],
            leaving=[address_text(a) for a in diff.leaving],
        )
        assert self._nursery is not None
        for address in diff.leaving:
            if address in self.joining:
                self._nursery.start_soon(self.joining.pop(address).retire, 0)
            else:
                leaver = self.members.pop(address)
                self.leaving[address] = leaver
                self._nursery.start_soon(self._drain, address, leaver)
        if diff.leaving:
            self._on_change()  # still listed (draining), no longer dispatched to
        for address in joining:
            runner = self._new_runner(
                member_id(self.deployment_name, self.key, address),
                Replica(
                    endpoint=member_url(self.entry.effective_scheme, address),
                    model=self.entry.model,
                ),
            )
            # Listed only once its task runs: `retire` waits for every listed runner's end.
            await self._nursery.start(runner.run)
            self.joining[address] = runner
            self._nursery.start_soon(self._join_when_ready, address, runner)

    async def _join_when_ready(self, address: Address, runner: ReplicaRunner) -> None:
        rec = runner.record
        await runner.policy.changes.wait_until(lambda: rec.lifecycle is S.READY or rec.retired)
        if rec.lifecycle is not S.READY:
            return  # the address left before it joined
        if self.joining.get(address) is not runner:
            return
        del self.joining[address]
        self.members[address] = runner
        self._emit("discovered_replica_joined", replica=rec.id, address=address_text(address))
        self._on_change()

    async def _drain(self, address: Address, runner: ReplicaRunner) -> None:
        self._emit(
            "discovered_replica_leaving", replica=runner.record.id, address=address_text(address)
        )
        await runner.retire(self._drain_timeout_s)
        del self.leaving[address]
        self._on_change()
        if address in self.discovered:  # it came back while draining
            self.request_resolution()

    def _emit(self, event: str, **fields) -> None:
        self._events.emit(
            event, deployment=self.deployment_name, discover=self.entry.discover, **fields
        )

    # -- inventory -------------------------------------------------------------------
    def snapshot(self, now: float) -> DiscoveryView:
        sets: tuple[tuple[MembershipStatus, dict[Address, ReplicaRunner]], ...] = (
            ("member", self.members),
            ("joining", self.joining),
            ("leaving", self.leaving),
        )
        rows = [
            (address, runner, status)
            for status, runners in sets
            for address, runner in runners.items()
        ]
        assert self.entry.discover is not None  # a group is made for a discover entry
        return DiscoveryView(
            discover=self.entry.discover,
            scheme=self.entry.effective_scheme,
            refresh_s=self.entry.effective_refresh_s,
            discovered=tuple(
                DiscoveredAddress(
                    address=address_text(address),
                    replica=runner.record.id,
                    status=status,
                    state=runner.record.state(now),
                    reason=runner.record.reason,
                )
                for address, runner, status in sorted(rows, key=lambda row: row[0])
            ),
            last_resolution=_resolution_view(self.last, now),
            last_good_resolution=_resolution_view(self.last_good, now),
            next_resolution_in_s=round(max(0.0, self.schedule.next_due() - now), 3),
        )


def _resolution_view(resolution: Resolution | None, now: float) -> ResolutionView | None:
    if resolution is None:
        return None
    return ResolutionView(
        at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(resolution.wall_time)),
        age_s=round(max(0.0, now - resolution.at), 3),
        count=resolution.count,
        error=resolution.error,
    )
