"""Supervisor and `open_router`: the embedding API of the pool.

Supervision tree: the Supervisor nursery holds one DeploymentPool task per deployment;
each pool's nursery holds one ReplicaRunner task per replica, and one DiscoveryGroup task
per `discover` entry, which holds a ReplicaRunner per discovered address
(sr.pool.discovery). The router-wide assignment sequence lives here, so
least-recently-assigned ties survive reloads.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
import weakref
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio

from sr.api.typed import TypedApi
from sr.config.schema import Deployment, Replica, SrConfig
from sr.errors import (
    ModelNotFound,
    ReloadFailed,
    StartupFailed,
    UsageError,
)
from sr.events import EventSink
from sr.http.private_folder import ensure_private_folder
from sr.pool import worker_exchange
from sr.pool.changes import StateChanges
from sr.pool.deployment import DeploymentPool, HangUpWatch, Reply
from sr.pool.discovery import DiscoveryGroup, DnsResolver, Resolver, group_key
from sr.pool.identity import replica_identities
from sr.pool.policy import DeploymentPolicy
from sr.pool.record import ReplicaRecord
from sr.pool.replica import ReplicaRunner
from sr.pool.run_dir import claim_run_dir, remove_stale_run_dirs
from sr.pool.state import ReplicaState
from sr.pool.transport import Transport
from sr.pool.views import Inventory
from sr.pool.worker_access import WorkerAccess, entry_accesses
from sr.pool.worker_exchange import ReplicaScrape, WorkerAnswer
from sr.settings import Settings, read_process_settings

if TYPE_CHECKING:
    from sr.pool.dispatch_trace import DispatchTrace

DRAIN_TIMEOUT_S = 30.0


class Supervisor:
    def __init__(
        self,
        config: SrConfig,
        nursery: trio.Nursery,
        *,
        events: EventSink,
        threads: int,
        run_dir: Path,
        worker_factory: Callable[[Any], Any] | None,
        settings: Settings,
        resolver: Resolver | None = None,
        connect_endpoint: Callable[[str], Transport] | None = None,
    ) -> None:
        """`resolver` resolves `discover` names (default: DNS); `connect_endpoint(url)`, when
        given, replaces how every attached worker is reached (tests)."""
        self.config = config
        self.settings = settings
        self.events = events
        self.threads = threads
        self.run_dir = run_dir
        self.worker_factory = worker_factory
        self.resolver: Resolver = resolver or DnsResolver()
        self.connect_endpoint = connect_endpoint
        # the key and CA bundle each live runner was built with (sr.pool.worker_access)
        self._access_fingerprints: weakref.WeakKeyDictionary[ReplicaRunner, str] = (
            weakref.WeakKeyDictionary()
        )
        self.pools: dict[str, DeploymentPool] = {}
        self._nursery = nursery
        self._sequence = itertools.count(1)
        # Every deployment's replica changes, for `wait_ready` and a reload's warm-up.
        self.changes = StateChanges()
        # The router's one reload lock: a reload from the Python API waits for the one
        # running; the file reloader (sr.router.reload) refuses instead (`reloading`).
        self._reload_lock = trio.Lock()
        # The typed Python API over this pool (sr.api.typed); its calls are offered here as
        # the router's own, as docs/python-api.md shows them (`router.embed(...)`).
        self.api = TypedApi(self)
        self.request = self.api.request
        self.embed = self.api.embed
        self.classify = self.api.classify
        self.decide = self.api.decide
        self.rerank = self.api.rerank

    # -- requests -------------------------------------------------------------------
    def resolve(self, model: str) -> str:
        """A deployment name, or the artifact of exactly one deployment."""
        if model in self.pools:
            return model
        for name, pool in self.pools.items():
            if pool.config.artifact == model:
                return name
        raise ModelNotFound(f"model {model!r} is not served here; known: {sorted(self.pools)}")

    def artifact_of(self, deployment: str) -> str:
        """The artifact `deployment` serves: the `model` a typed request names."""
        return self.pools[deployment].config.artifact

    async def request_raw(
        self,
        deployment: str,
        path: str,
        body: bytes,
        *,
        timeout_s: float | None = None,
        request_id: str | None = None,
        watch: HangUpWatch | None = None,
        trace: DispatchTrace | None = None,
    ) -> Reply:
        """The deployment's answer (sr.pool.deployment.DeploymentPool.request_raw);
        ClientDisconnected when `watch` saw the caller hang up first. `trace`: the
        request's spans (sr.pool.dispatch_trace), only when traces are on."""
        pool = self.pools.get(deployment)
        if pool is None:
            raise ModelNotFound(f"deployment {deployment!r} does not exist")
        return await pool.request_raw(path, body, timeout_s, request_id, watch, trace)

    # -- views ----------------------------------------------------------------------
    def inventory(self) -> Inventory:
        """Every deployment and replica as typed views (sr.pool.views)."""
        now = trio.current_time()  # one instant for the whole snapshot
        return Inventory(
            ready=self.is_ready(),
            deployments={name: pool.snapshot(now) for name, pool in self.pools.items()},
        )

    async def replica_metrics(self, timeout_s: float) -> list[ReplicaScrape]:
        """GET /metrics of every connected replica (sr.pool.worker_exchange.scrape_metrics)."""
        return await worker_exchange.scrape_metrics(self.pools, timeout_s)

    async def post_to_worker(
        self, deployment: str, replica: str | int, path: str, body: bytes, *, timeout_s: float
    ) -> WorkerAnswer:
        """POST to one replica's worker, outside dispatch (sr.pool.worker_exchange)."""
        return await worker_exchange.post_to_worker(
            self.pools, deployment, replica, path, body, timeout_s=timeout_s
        )

    def model_card(self, deployment: str) -> dict[str, Any] | None:
        """A copy of the worker card (its GET /v1/models entry) of one ready replica of
        `deployment`, or None while none is ready. Replicas of a deployment share artifact,
        revision, dtype and engine caps (checked when the card is read), so any one will do."""
        pool = self.pools.get(deployment)
        if pool is None:
            raise ModelNotFound(f"deployment {deployment!r} does not exist")
        for runner in pool.runners.values():
            card = runner.record.card
            if runner.record.lifecycle is ReplicaState.READY and card is not None:
                return dict(card)
        return None

    def served_dtype(self, deployment: str) -> str | None:
        """The dtype a ready replica of `deployment` serves (its card: `auto` resolved on
        the worker's host), or None while none is ready or the deployment is gone."""
        pool = self.pools.get(deployment)
        card = self.model_card(deployment) if pool is not None else None
        return None if card is None else card.get("dtype")

    def is_ready(self) -> bool:
        return bool(self.pools) and all(pool.has_ready() for pool in self.pools.values())

    async def wait_ready(self, timeout_s: float | None = None) -> None:
        """Until every deployment has a ready replica; StartupFailed when one never can."""
        limit = self.settings.ready_timeout_s if timeout_s is None else timeout_s
        with trio.move_on_after(limit):
            await self.changes.wait_until(lambda: self.is_ready() or self._hopeless() is not None)
            hopeless = self._hopeless()
            if hopeless is not None:
                raise StartupFailed(
                    f"deployment {hopeless!r} cannot start: {_describe(self.pools[hopeless])}"
                )
            return
        waiting = [
            f"{name}: " + _describe(pool)
            for name, pool in self.pools.items()
            if not pool.has_ready()
        ]
        raise StartupFailed(f"not ready after {limit:g}s: " + "; ".join(waiting))

    def _hopeless(self) -> str | None:
        """The first deployment whose replicas are all terminal, or None."""
        return next((name for name, pool in self.pools.items() if pool.all_terminal()), None)

    # -- building and reloading -----------------------------------------------------
    async def _prepare(
        self, config: SrConfig, failure: type[StartupFailed] | type[ReloadFailed]
    ) -> tuple[dict[str, _Plan], list[ReplicaRunner], list[DeploymentPool]]:
        """Runners and discovery groups for every deployment of `config`, reusing live ones
        with the same identity; new ones are started (not yet published). A key or CA
        bundle that cannot be used raises `failure` before anything starts."""
        accesses = entry_accesses(config, failure, self.settings.environ)
        plan: dict[str, _Plan] = {}
        started: list[ReplicaRunner] = []
        new_pools: list[DeploymentPool] = []
        for name, deployment in config.deployments.items():
            pool = self.pools.get(name)
            if pool is None:
                policy = DeploymentPolicy(
                    name,
                    next_sequence=self._sequence.__next__,
                    outlier=deployment.outlier_detection,
                    events=self.events,
                    changes=self.changes,
                )
                pool = DeploymentPool(name, deployment, policy)
                await self._nursery.start(pool.run)
                new_pools.append(pool)
            placements = deployment.placements()
            static = [p for p in placements if not p.discovered]
            if len(static) != len(placements):
                # Identities as if the discover entries were not there: adding one
                # restarts no other replica.
                deployment_static = attrs.evolve(deployment, replicas=static)
            else:
                deployment_static = deployment
            runners: dict[str, ReplicaRunner] = {}
            for replica_id, placement in replica_identities(name, deployment_static, self.threads):
                access = accesses.get((name, placements.index(placement)), WorkerAccess())
                old = pool.static_runners.get(replica_id)
                if (
                    old is not None
                    and old.record.lifecycle not in (ReplicaState.FAILED,)
                    # a changed key or CA bundle replaces the replica (same id): its
                    # transport was built with the old ones
                    and self._access_fingerprints.get(old, "") == access.fingerprint
                ):
                    old.deployment = deployment  # same identity: only non-engine fields differ
                    runners[replica_id] = old
                    continue
                runner = self._new_runner(pool, deployment, replica_id, placement, access)
                pool.policy.note_state(runner.record, trio.current_time())
                await pool.start_runner(runner)
                runners[replica_id] = runner
                started.append(runner)
            groups: dict[str, DiscoveryGroup] = {}
            for index, entry in enumerate(placements):
                if entry.discovered:
                    access = accesses[(name, index)]
                    key = group_key(name, entry, deployment, access.fingerprint)
                    group = pool.groups.get(key)
                    if group is not None:
                        group.update(entry, deployment)
                    else:
                        group = self._new_group(pool, deployment, entry, key, access)
                        await pool.start_group(group)
                    groups[key] = group
            plan[name] = _Plan(runners, groups)
        return plan, started, new_pools

    def _new_runner(
        self,
        pool: DeploymentPool,
        deployment: Deployment,
        replica_id: str,
        placement: Replica,
        access: WorkerAccess,
        tls_server_name: str | None = None,
    ) -> ReplicaRunner:
        record = ReplicaRecord(
            replica_id=replica_id,
            deployment=pool.name,
            placement=placement.endpoint or placement.device or "cpu",
            attached=placement.attached,
            threads=None if placement.attached else self.threads,
        )
        runner = ReplicaRunner(
            record=record,
            placement=placement,
            deployment=deployment,
            policy=pool.policy,
            threads=self.threads,
            run_dir=self.run_dir,
            settings=self.settings,
            worker_factory=None if placement.attached else self.worker_factory,
            connect_endpoint=self.connect_endpoint or access.connector(tls_server_name),
        )
        self._access_fingerprints[runner] = access.fingerprint
        return runner

    def _new_group(
        self,
        pool: DeploymentPool,
        deployment: Deployment,
        entry: Replica,
        key: str,
        access: WorkerAccess,
    ) -> DiscoveryGroup:
        def new_member(replica_id: str, placement: Replica) -> ReplicaRunner:
            # Dialled by address, verified against the name: the workers' certificate is
            # issued for the service (sr.pool.transport).
            return self._new_runner(
                pool,
                group.deployment,
                replica_id,
                placement,
                access,
                tls_server_name=group.host if entry.effective_scheme == "https" else None,
            )

        group = DiscoveryGroup(
            deployment_name=pool.name,
            deployment=deployment,
            entry=entry,
            key=key,
            resolver=self.resolver,
            new_runner=new_member,
            on_change=pool.recompose,
            events=self.events,
            drain_timeout_s=DRAIN_TIMEOUT_S,
            changes=self.changes,
        )
        return group

    def _publish(
        self,
        config: SrConfig,
        plan: dict[str, _Plan],
        new_pools: list[DeploymentPool],
    ) -> list[ReplicaRunner | DeploymentPool | DiscoveryGroup]:
        """Swap in the new replica sets at once; returns what to retire."""
        retired: list[ReplicaRunner | DeploymentPool | DiscoveryGroup] = []
        for name, pool in list(self.pools.items()):
            keep = plan.get(name, _Plan({}, {}))
            # by object: a runner replaced under the same id (a changed key) retires too
            retired += [
                r for rid, r in pool.static_runners.items() if keep.runners.get(rid) is not r
            ]
            retired += [g for key, g in pool.groups.items() if key not in keep.groups]
            if name not in plan:
                retired.append(pool)
                del self.pools[name]
        fresh = {pool.name: pool for pool in new_pools}
        for name, item in plan.items():
            pool = self.pools.get(name) or fresh[name]
            pool.publish(config.deployments[name], item.runners, item.groups)
            self.pools[name] = pool
        self.config = config
        return retired

    async def start(self, config: SrConfig) -> None:
        plan, _, new_pools = await self._prepare(config, StartupFailed)
        self._publish(config, plan, new_pools)

    @property
    def reloading(self) -> bool:
        """A reload is running (or queued)."""
        return self._reload_lock.locked()

    async def reload(self, config: SrConfig, *, timeout_s: float | None = None) -> None:
        """Bring up what is new, publish atomically, then retire what was removed. One
        at a time: a second call waits for the first. The environment is read again: a
        worker key that `api_key_env` names may have been rotated (sr.settings)."""
        async with self._reload_lock:
            try:
                self.settings = read_process_settings()
            except UsageError as error:
                raise ReloadFailed(str(error)) from None
            plan, started, new_pools = await self._prepare(config, ReloadFailed)
            # Discovery groups this reload adds warm up first (Envoy's cluster warming):
            # resolved once, and every address of it joined.
            new_groups = [
                (name, group)
                for name, item in plan.items()
                for key, group in item.groups.items()
                if key not in (self.pools[name].groups if name in self.pools else {})
            ]
            limit = self.settings.ready_timeout_s if timeout_s is None else timeout_s

            def failed_runner() -> ReplicaRunner | None:
                return next(
                    (
                        r
                        for r in started
                        if r.record.lifecycle is ReplicaState.FAILED
                        or r.record.lifecycle is ReplicaState.INCOMPATIBLE
                    ),
                    None,
                )

            def failed_group() -> str | None:
                return next(
                    (
                        f"deployment {name!r} discover {group.entry.discover}: {why}"
                        for name, group in new_groups
                        if (why := group.warm_failure()) is not None
                    ),
                    None,
                )

            def settled() -> bool:
                warm = all(r.record.lifecycle is ReplicaState.READY for r in started) and all(
                    group.is_warm() for _, group in new_groups
                )
                return warm or failed_runner() is not None or failed_group() is not None

            with trio.move_on_after(limit) as scope:
                await self.changes.wait_until(settled)
            failure = failed_runner()
            group_failure = failed_group()
            if failure is not None or group_failure is not None or scope.cancelled_caught:
                for runner in started:
                    self._nursery.start_soon(runner.retire, 0)
                for _, group in new_groups:
                    self._nursery.start_soon(group.retire, 0)
                for pool in new_pools:
                    pool.cancel_scope.cancel()
                prefix = "reload failed, old config still serving: "
                culprit = failure or next(
                    (r for r in started if r.record.lifecycle is not ReplicaState.READY), None
                )
                if group_failure is not None or culprit is None:
                    waiting = group_failure or "; ".join(
                        f"deployment {name!r} discover {group.entry.discover}: not warm"
                        f" ({group.describe()})"
                        for name, group in new_groups
                        if not group.is_warm()
                    )
                    raise ReloadFailed(prefix + waiting)
                rec = culprit.record
                raise ReloadFailed(
                    f"{prefix}deployment {rec.deployment!r} "
                    f"replica {rec.id}: {rec.state(trio.current_time()).value}"
                    + (f" ({rec.reason})" if rec.reason else "")
                )
            for item in self._publish(config, plan, new_pools):
                self._nursery.start_soon(_retire, item)

    async def aclose(self) -> None:
        """Drain every replica (bounded) and stop every worker."""
        async with trio.open_nursery() as nursery:
            for pool in self.pools.values():
                nursery.start_soon(_retire, pool)
        self.pools = {}


async def _retire(item: ReplicaRunner | DeploymentPool | DiscoveryGroup) -> None:
    if isinstance(item, DeploymentPool):
        async with trio.open_nursery() as nursery:
            for runner in item.static_runners.values():
                nursery.start_soon(runner.retire, DRAIN_TIMEOUT_S)
            for group in item.groups.values():
                nursery.start_soon(group.retire, DRAIN_TIMEOUT_S)
        item.cancel_scope.cancel()
    else:
        await item.retire(DRAIN_TIMEOUT_S)


@attrs.frozen
class _Plan:
    """One deployment's replicas after a (re)load: static runners and discovery groups."""

    runners: dict[str, ReplicaRunner]
    groups: dict[str, DiscoveryGroup]


def _describe(pool: DeploymentPool) -> str:
    now = trio.current_time()
    parts = []
    for runner in pool.runners.values():
        rec = runner.record
        text = f"replica {rec.id} ({rec.placement}) {rec.state(now).value}"
        parts.append(text + (f": {rec.reason}" if rec.reason else ""))
    parts += [f"discover {g.entry.discover}: {g.describe()}" for g in pool.groups.values()]
    return ", ".join(parts) or "no replicas"


def default_worker_threads(settings: Settings) -> int:
    """Half the router's CPU budget, 1..16, or VLLM_SRUN_CPU_THREADS (sr.thread_budget)."""
    from sr.devices import cpu_budget
    from sr.thread_budget import capped_thread_count

    return capped_thread_count(cpu_budget(), settings.worker_threads)


@contextlib.asynccontextmanager
async def open_router(
    config: SrConfig,
    *,
    events: EventSink | None = None,
    in_process: bool = False,
    threads: int | None = None,
    run_dir: str | Path | None = None,
    worker_factory: Callable[[Any], Any] | None = None,
    resolver: Resolver | None = None,
    connect_endpoint: Callable[[str], Transport] | None = None,
    settings: Settings | None = None,
) -> AsyncIterator[Supervisor]:
    """Start and supervise every deployment's workers; leaving drains and stops them.

    `in_process=True` runs each managed replica as a `WorkerService` in this process;
    `worker_factory(WorkerOptions) -> service` overrides which service (tests).
    `resolver` resolves `discover` entries (default: DNS, sr.pool.discovery);
    `connect_endpoint(url) -> Transport` overrides how attached workers are reached (tests).
    `settings`: the environment as `sr serve` read it (default: read now, sr.settings)."""
    settings = settings if settings is not None else read_process_settings()
    if in_process and worker_factory is None:
        from sr.worker.service import WorkerService

        worker_factory = WorkerService
    # A key variable that is not set or a CA bundle that cannot be read fails here, as
    # itself, before any worker starts (and again at each reload: sr.pool.worker_access).
    entry_accesses(config, StartupFailed, settings.environ)
    events = events or EventSink()
    lock_fd: int | None = None  # set when sr makes (and so owns) the run folder
    if run_dir is None:
        # Folders of routers that died without cleaning up (SIGKILL, OOM); their workers
        # died with them (sr.worker.parent_watch). A caller's run_dir is never swept.
        parent = Path(tempfile.gettempdir())
        stale = remove_stale_run_dirs(parent)
        if stale:
            events.emit("stale_run_dirs_removed", folders=[str(p) for p in stale])
        path, lock_fd = claim_run_dir(parent)
    else:
        path = Path(run_dir)
        ensure_private_folder(path, label="run_dir: the worker socket folder")
    body_error: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            core = Supervisor(
                config,
                nursery,
                events=events,
                threads=threads if threads is not None else default_worker_threads(settings),
                run_dir=path,
                worker_factory=worker_factory,
                settings=settings,
                resolver=resolver,
                connect_endpoint=connect_endpoint,
            )
            await core.start(config)
            try:
                yield core
            except BaseException as error:
                body_error = error
                raise
            finally:
                with trio.CancelScope(shield=True):
                    await core.aclose()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The caller's own exception comes back as itself, not wrapped by our nursery.
        if body_error is not None and list(group.exceptions) == [body_error]:
            raise body_error from None
        raise
    finally:
        if lock_fd is not None:
            shutil.rmtree(path, ignore_errors=True)
            os.close(lock_fd)  # after the removal: a held lock keeps sweepers away
