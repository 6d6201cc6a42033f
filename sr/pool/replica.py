"""ReplicaRunner: the one task that owns a replica's worker, its prober and its drain.

Three kinds, one task shape:
* managed — starts `python -m sr worker ... --uds PATH` (argv list, no shell), restarts
  it with restart backoff when it exits, stops it with SIGTERM then SIGKILL after a grace;
  it holds the write end of a pipe whose read end is the worker's `--parent-fd`, so the
  worker exits when this process dies, however it dies (sr.worker.parent_watch). A CPU
  worker is forked when `SR_WORKER_START` allows (sr.pool.forked: same argv, exit status,
  signals and parent pipe), by its model's fork server, which loaded the model before
  forking, else by the router's fork server, else spawned directly (each fallback logged). The
  worker logs JSON lines naming its deployment and replica, relayed into this process's
  log (sr.pool.worker_log); an exit is described in words (`killed by SIGKILL`);
* attached (`endpoint`) — only probed, never started or stopped; never terminal: when it
  is failed, incompatible or unreachable it is probed at the slow cadence until the
  operator's worker comes back (sr.pool.state);
* in-process — a `WorkerService` run in this task's nursery, called directly.

The prober polls `/health` fast while the replica is not ready and slowly once it is, and
at once when the pool asks (after a failed or timed-out request). Whenever the replica
turns ready it reads the card (`/v1/models`) for threads, artifact and engine caps (an
attached worker may have been replaced by another while we were not looking).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from sr.config.schema import DEFAULT_KERNEL, Deployment, Replica
from sr.pool.fork_start import worker_env
from sr.pool.forked import (
    ForkServer,
    ForkServerError,
    forkable,
    lease_fork_server,
    lease_model_server,
    start_method,
)
from sr.pool.policy import DeploymentPolicy
from sr.pool.record import ReplicaRecord
from sr.pool.state import HEALTH_STATUS, TERMINAL_EARLY_EXITS, ReplicaState
from sr.pool.transport import (
    HttpTransport,
    HttpxTransport,
    InProcessTransport,
    Transport,
    TransportError,
)
from sr.pool.worker_log import WorkerLogRelay, describe_exit
from sr.settings import Settings, read_process_settings

S = ReplicaState
PROBE_NOT_READY_S = 0.1
PROBE_READY_S = 1.5
PROBE_TIMEOUT_S = 2.0
STOP_GRACE_S = 5.0
# After a worker is gone, how long its stderr may take to reach EOF (a child of the worker
# could hold the pipe open): its last lines are the exit's reason.
STDERR_DRAIN_S = 1.0


def worker_argv(
    deployment: Deployment,
    device: str,
    threads: int,
    uds: str,
    *,
    parent_fd: int | None = None,
    names: tuple[str, str] | None = None,
) -> list[str]:
    """`names`: (deployment name, replica id), stamped by the worker on its log lines."""
    argv = [sys.executable, "-m", "sr", "worker", *deployment.engine_args().argv()]
    argv += ["--device", device, "--threads", str(threads)]
    if parent_fd is not None:
        argv += ["--parent-fd", str(parent_fd)]
    if names is not None:
        argv += ["--deployment", names[0], "--replica", names[1]]
    # JSON whatever the router's own format: the relay reads it (sr.pool.worker_log).
    argv += ["--log-format", "json"]
    return [*argv, "--uds", uds]


def incompatibility(deployment: Deployment, card: dict) -> str | None:
    """Why a worker's card does not match the deployment's artifact, pinned revision or
    engine caps, or None (all replicas of a deployment share them). A card that does not
    mention a field is not held against the worker."""
    served = card.get("artifact") or card.get("id")
    if served is not None and str(served).rstrip("/") != deployment.artifact.rstrip("/"):
        return f"artifact: deployment serves {deployment.artifact!r}, worker serves {served!r}"
    pinned = deployment.revision
    if pinned is not None and "revision" in card and card["revision"] != pinned:
        return f"revision: deployment pins {pinned!r}, worker serves {card['revision']!r}"
    # A worker states the dtype it serves and the one it was asked for (`precision`); an
    # `auto` deployment accepts what the worker's host chose for its profile.
    asked = (card.get("precision") or {}).get("requested")
    if "dtype" in card and deployment.dtype not in (card["dtype"], asked):
        return f"dtype: deployment serves {deployment.dtype}, worker serves {card['dtype']}"
    served_kernel = (card.get("kernel") or {}).get("linear")
    if deployment.kernel != DEFAULT_KERNEL and served_kernel not in (None, deployment.kernel):
        return f"kernel: deployment asks for {deployment.kernel}, worker serves {served_kernel}"
    # A worker from before engines existed states none: it computes with torch.
    served_engine = (card.get("engine") or {}).get("name")
    if served_engine is not None and served_engine != deployment.engine:
        return f"engine: deployment runs {deployment.engine}, worker runs {served_engine}"
    limits = card.get("limits") or {}
    for key in ("max_num_seqs", "max_num_batched_tokens"):
        wanted = getattr(deployment, key)
        if wanted is not None and limits.get(key) != wanted:
            return f"{key}: deployment sets {wanted}, worker reports {limits.get(key)}"
    return None


@attrs.define(eq=False, kw_only=True)  # eq=False: runners are keys, by identity
class ReplicaRunner:
    record: ReplicaRecord
    placement: Replica
    deployment: Deployment
    policy: DeploymentPolicy
    threads: int
    run_dir: Path
    # The router's (sr.settings); a managed worker starts with their environment (None:
    # read when it starts).
    settings: Settings | None = None
    worker_factory: Callable[[Any], Any] | None = None
    connect_endpoint: Callable[[str], Transport] = attrs.field(
        default=None, converter=lambda given: given or _http_endpoint
    )
    transport: Transport | None = attrs.field(default=None, init=False)
    cancel_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope, init=False)
    done: trio.Event = attrs.field(factory=trio.Event, init=False)
    _probe_now: trio.Event = attrs.field(factory=trio.Event, init=False)
    _incarnation: int = attrs.field(default=0, init=False)
    _last_worker_message: str = attrs.field(default="", init=False)
    _last_exit_note: str = attrs.field(default="", init=False)

    # -- public ---------------------------------------------------------------------
    def request_probe(self) -> None:
        self._probe_now.set()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            with self.cancel_scope:
                if self.placement.attached:
                    await self._serve(self.connect_endpoint(self.placement.endpoint))
                elif self.worker_factory is not None:
                    await self._run_in_process()
                else:
                    await self._run_managed()
                await trio.sleep_forever()  # terminal: stay listed until retired
        finally:
            self.transport = None
            self.done.set()

    async def retire(self, drain_timeout_s: float) -> None:
        """Stop taking work, finish in-flight requests (bounded), then stop the worker."""
        rec = self.record
        rec.retired = True
        self.policy.set_lifecycle(rec, S.DRAINING, trio.current_time(), rec.reason)
        with trio.move_on_after(drain_timeout_s):
            await self.policy.changes.wait_until(lambda: rec.inflight == 0)
        self.cancel_scope.cancel()
        await self.done.wait()

    # -- kinds ----------------------------------------------------------------------
    async def _run_in_process(self) -> None:
        from sr.worker.options import WorkerOptions

        options = WorkerOptions.serving(
            self.deployment.engine_args(),
            device=self.placement.device or "cpu",
            threads=self.threads,
        )
        try:
            service = self.worker_factory(options)
            async with trio.open_nursery() as nursery:
                await nursery.start(service.run)
                await self._serve(InProcessTransport(service))
                nursery.cancel_scope.cancel()
        except Exception as error:  # the in-process worker crashed: a terminal failure
            self._set(S.FAILED, f"in-process worker failed: {type(error).__name__}: {error}")

    async def _run_managed(self) -> None:
        rec = self.record
        method, warning = start_method(self.placement.device or "cpu", self._child_env())
        if warning:
            self.policy.events.emit(
                "worker_start_invalid", deployment=rec.deployment, replica=rec.id, reason=warning
            )
        if method == "spawn":
            await self._restart_loop([])
            return
        # a worker argv of this replica; its model's server is keyed by what decides the model
        names = (rec.deployment, rec.id)
        model_argv = worker_argv(self.deployment, "cpu", self.threads, "", names=names)
        events, env = self.policy.events, self._child_env()
        async with (
            lease_fork_server(self.run_dir, env) as server,
            lease_model_server(self.run_dir, server, model_argv, env, events) as model,
        ):
            await self._restart_loop([model, server])

    def _child_env(self) -> dict[str, str]:
        if self.settings is None:
            self.settings = read_process_settings()
        return worker_env(self.settings.environ)

    async def _restart_loop(self, servers: list[ForkServer]) -> None:
        while True:
            self._incarnation += 1
            verdict, code = await self._run_incarnation(servers)
            if verdict == "failed" or not await self._after_exit(code):
                return

    async def _start_worker(self, argv: list[str], parent_read: int, servers: list[ForkServer]):
        """The worker's process: forked by the first of `servers` that can, else spawned."""
        for index, server in enumerate(servers if forkable(argv) else []):
            try:
                return await server.fork_worker(
                    argv, parent_read=parent_read, env=self._child_env()
                )
            except ForkServerError as error:
                rec = self.record
                self.policy.events.emit(
                    f"{server.kind}_unavailable",
                    deployment=rec.deployment,
                    replica=rec.id,
                    reason=str(error),
                    fallback=servers[index + 1].kind if index + 1 < len(servers) else "spawn",
                )
        # stdout is the worker's announcement channel for humans running it by hand;
        # the pool learns everything over the socket, and sr serve's stdout stays ours.
        return await trio.lowlevel.open_process(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=self._child_env(),
            pass_fds=(parent_read,),
        )

    async def _run_incarnation(self, servers: list[ForkServer]) -> tuple[str | None, int | None]:
        """One worker process from start to exit; returns (probe verdict, exit status)."""
        rec = self.record
        uds = self.run_dir / f"{rec.id}-{self._incarnation}.sock"
        uds.unlink(missing_ok=True)
        device = self.placement.device or "cpu"
        # Nothing is ever written to this pipe: the kernel closes our write end when this
        # process dies, even by SIGKILL, and the worker reads EOF. os.pipe() fds are
        # non-inheritable, so no other worker holds this one's write end open.
        parent_read, parent_alive = os.pipe()
        argv = worker_argv(
            self.deployment,
            device,
            self.threads,
            str(uds),
            parent_fd=parent_read,
            names=(rec.deployment, rec.id),
        )
        self._set(S.STARTING, None)
        try:
            process = await self._start_worker(argv, parent_read, servers)
        except BaseException:
            os.close(parent_alive)
            raise
        finally:
            os.close(parent_read)
        rec.pid = process.pid
        relay = WorkerLogRelay(
            deployment=rec.deployment, replica=rec.id, pid=process.pid, on_state=self.request_probe
        )
        transport = HttpTransport(uds=str(uds))
        verdict: str | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pump_stderr, process.stderr, relay)

                async def serve() -> None:
                    nonlocal verdict
                    verdict = await self._serve(transport)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(serve)
                await process.wait()
                nursery.cancel_scope.cancel()
        finally:
            self.transport = None
            try:
                with trio.CancelScope(shield=True):
                    await transport.aclose()
                    await stop_process(process, STOP_GRACE_S)
                    await _drain_stderr(process.stderr, relay)
            finally:
                # Only after the stop (closing it earlier cuts the graceful drain short),
                # but always: a worker we failed to stop then exits on its own.
                os.close(parent_alive)
            rec.pid = None
            uds.unlink(missing_ok=True)
            self._last_worker_message = relay.last_message
            # a forked worker whose fork server died: no exit status to describe
            self._last_exit_note = getattr(process, "exit_note", "")
        return verdict, process.returncode

    async def _after_exit(self, code: int | None) -> bool:
        """A managed worker exited on its own: restart after backoff, or give up (False)."""
        rec = self.record
        now = trio.current_time()
        if not rec.restart.was_ready:
            rec.early_exits += 1
        why = describe_exit(code, self._last_worker_message)
        if self._last_exit_note:
            why = f"{why} ({self._last_exit_note})"
        if rec.early_exits >= TERMINAL_EARLY_EXITS:
            self._set(S.FAILED, f"{why} ({rec.early_exits} exits before becoming ready)")
            return False
        delay = rec.restart.exited(now)
        self._set(S.RESTARTING, f"{why}; restarting in {delay:g}s")
        await trio.sleep(delay)
        self.policy.events.emit(
            "replica_restarted",
            deployment=rec.deployment,
            replica=rec.id,
            restarts=rec.restart.restarts,
        )
        return True

    # -- probing --------------------------------------------------------------------
    async def _serve(self, transport: Transport) -> str:
        """Probe until the replica is terminal; returns "failed". Never returns otherwise
        except by cancellation: an incompatible managed replica keeps its process, idle,
        and an attached replica is never terminal (it is re-probed until it recovers)."""
        rec = self.record
        attached = self.placement.attached
        self.transport = transport
        try:
            while True:
                self._probe_now = trio.Event()
                state, reason = await self._probe(transport)
                if state is S.READY and (rec.lifecycle is not S.READY or _still_learning(rec.card)):
                    state, reason = await self._check_card(transport)
                if state in (S.FAILED, S.INCOMPATIBLE) and not attached:
                    self._set(state, reason)
                    if state is S.INCOMPATIBLE:
                        await trio.sleep_forever()
                    return "failed"
                self._set(state, reason)
                slow = state is S.READY or (attached and state in _ATTACHED_SLOW)
                with trio.move_on_after(PROBE_READY_S if slow else PROBE_NOT_READY_S):
                    await self._probe_now.wait()
        finally:
            with trio.CancelScope(shield=True):
                if attached:
                    await transport.aclose()

    async def _check_card(self, transport: Transport) -> tuple[ReplicaState, str | None]:
        """Read the card of a replica whose /health says ready; the state it really is in."""
        card = await self._read_card(transport)
        if card is None:
            return S.UNREACHABLE, "could not read the model card"
        rec = self.record
        rec.card = card
        rec.threads = card.get("threads", rec.threads)
        why = incompatibility(self.deployment, card)
        return (S.READY, None) if why is None else (S.INCOMPATIBLE, why)

    async def _probe(self, transport: Transport) -> tuple[ReplicaState, str | None]:
        with trio.move_on_after(PROBE_TIMEOUT_S):
            try:
                status, _, body = await transport.exchange("GET", "/health")
            except TransportError as error:
                if self._never_answered():
                    return S.STARTING, None  # the socket is not up yet
                return S.UNREACHABLE, str(error)
            if status == 200:
                return S.READY, None
            try:
                answer = json.loads(body)
            except ValueError:
                answer = {}
            state = HEALTH_STATUS.get(str(answer.get("status")))
            if state is None:
                return S.UNREACHABLE, f"/health answered {status}: {body[:200]!r}"
            return state, answer.get("reason")
        return S.UNREACHABLE, f"/health did not answer within {PROBE_TIMEOUT_S:g}s"

    async def _read_card(self, transport: Transport) -> dict | None:
        with trio.move_on_after(PROBE_TIMEOUT_S):
            try:
                status, _, body = await transport.exchange("GET", "/v1/models")
                data = json.loads(body).get("data") or [{}]
            except (TransportError, ValueError, AttributeError):
                return None
            return data[0] if status == 200 and isinstance(data[0], dict) else None
        return None

    def _never_answered(self) -> bool:
        return self.record.lifecycle in (S.STARTING, S.RESTARTING) and not self.placement.attached

    # -- helpers --------------------------------------------------------------------
    def _set(self, state: ReplicaState, reason: str | None) -> None:
        self.policy.set_lifecycle(self.record, state, trio.current_time(), reason)

    async def _pump_stderr(self, stream: trio.abc.ReceiveStream, relay: WorkerLogRelay) -> None:
        """Relay the worker's log into ours while it runs (the rest: `_drain_stderr`)."""
        while chunk := await stream.receive_some(65536):
            relay.feed(chunk)


# attached replicas in these states wait for their operator: probe them at the slow cadence
_ATTACHED_SLOW = frozenset({S.FAILED, S.INCOMPATIBLE, S.UNREACHABLE})


def _http_endpoint(url: str) -> Transport:
    return HttpxTransport(base_url=url)


def _still_learning(card: dict | None) -> bool:
    """Adaptive thread learning changes the card as it goes: keep the inventory's copy
    fresh (at the slow probe cadence) until learning has settled."""
    adaptive = (card or {}).get("adaptive_threads") or {}
    return adaptive.get("status") in ("locked", "warming", "learning")


async def _drain_stderr(stream: trio.abc.ReceiveStream | None, relay: WorkerLogRelay) -> None:
    """Relay what a stopped worker left in its stderr pipe (its last lines), then close it."""
    if stream is None:
        return
    with trio.move_on_after(STDERR_DRAIN_S):
        while chunk := await stream.receive_some(65536):
            relay.feed(chunk)
    relay.close()
    await stream.aclose()


async def stop_process(process: trio.Process, grace_s: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited after `grace_s`."""
    if process.returncode is None:
        process.terminate()
        with trio.move_on_after(grace_s):
            await process.wait()
    if process.returncode is None:
        process.kill()
        await process.wait()
