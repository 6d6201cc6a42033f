"""The worker's HTTP face: `WorkerService.handle` served by sr's HTTP/1.1 server
(sr.http.server, no ASGI) under Trio on a Unix socket (private folder) or loopback TCP."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from sr import request_id
from sr.errors import RequestError, UsageError
from sr.http.hop import Hop
from sr.http.limits import HttpLimits
from sr.http.private_folder import ensure_private_folder
from sr.http.server import H1Server, error_answer, open_listeners
from sr.worker import served_as
from sr.worker.auth import WorkerKeyCheck, unauthorized
from sr.worker.service import WorkerService

# The worker's HTTP limits (docs/security.md). Its usual caller is the router, which keeps
# connections open between requests: the 75 s idle timeout keeps the race "worker closes
# as the router reuses" rare. The body cap is the router's, so a body the router accepts
# is never refused here.
WORKER_HTTP_LIMITS = HttpLimits()
TRACEPARENT_HEADER = b"traceparent"
MAX_TRACEPARENT_BYTES = 128  # version 00 is 55; later versions may add fields


def request_names(headers: list[tuple[bytes, bytes]]) -> Hop:
    """The caller's `x-request-id` (the router always sends one), `x-sr-deployment`
    (sr.worker.served_as) and W3C `traceparent` (the router sends one when its traces are
    on: sr.worker.tracing); a direct caller's odd value is ignored rather than refused: the
    worker answers whoever can reach it."""
    rid = deployment = traceparent = None
    for name, value in headers:
        if name == request_id.HEADER:
            rid = request_id.usable(value)
        elif name == served_as.HEADER:
            deployment = served_as.deployment_of(value)
        elif name == TRACEPARENT_HEADER and len(value) <= MAX_TRACEPARENT_BYTES:
            traceparent = value.decode("latin-1")
    return Hop(rid, deployment, traceparent)


def handler_for(service: WorkerService, api_key: str | None = None):
    """The H1Server handler: the service's `handle`, told the caller's request id and the
    deployment it serves the request for; with `api_key`, callers without it get 401 on
    every route but the open ones (sr.worker.auth)."""
    handle = service.handle
    check = WorkerKeyCheck(api_key) if api_key is not None else None

    async def handler(method: str, path: str, body: bytes, headers) -> tuple:
        if check is not None and not check.allows(path, headers):
            return unauthorized()
        return await handle(method, path, body, request_names(headers))

    return handler


def answer_then_exit(service: WorkerService):
    """After each answer is written: the `exit` fault ends the process right there."""

    def after_answer() -> None:
        if service.exit_requested:
            service.exit_process(1)

    return after_answer


def prepare_uds(path: str) -> None:
    """Make sure the socket's folder is private, then remove a stale socket left by a dead worker.

    A missing folder is created 0700. An existing one is never chmodded (`--uds /tmp/x.sock`
    must not lock everyone out of /tmp): it must already belong to this user and be closed to
    group and others, otherwise the socket would be reachable by other local users."""
    target = Path(path)
    ensure_private_folder(target.parent, label="--uds: the socket folder")
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise UsageError(f"--uds: {path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(target))
    except OSError:
        target.unlink(missing_ok=True)  # nobody listens: stale
        return
    finally:
        probe.close()
    raise UsageError(f"--uds: {path} is in use by a running process")


async def serve_worker(
    service: WorkerService,
    *,
    uds: str | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen at once, then load the model; stops gracefully when `shutdown_trigger` returns.
    `api_key`: the key callers must send (sr.worker.auth).

    `task_status.started(binds)` reports where it listens (e.g. `http://127.0.0.1:41234`).
    """
    if uds is not None:
        prepare_uds(uds)
    server = H1Server(
        handler_for(service, api_key),
        WORKER_HTTP_LIMITS,
        after_answer=answer_then_exit(service),
        crash_answer=error_answer(RequestError("the worker failed to answer")),
    )
    listeners, binds = await open_listeners(uds=uds, host=host, port=port)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            await nursery.start(
                _serve_then_stop,
                server,
                listeners,
                shutdown_trigger or trio.sleep_forever,
                nursery.cancel_scope,
            )
            task_status.started(binds)
    finally:
        if uds is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(uds)


async def _serve_then_stop(server, listeners, shutdown_trigger, scope, *, task_status) -> None:
    # The server drains in-flight requests (graceful_timeout_s) before `serve` returns; only
    # then is the engine cancelled, so requests already accepted get their answers.
    await server.serve(listeners, shutdown_trigger=shutdown_trigger, task_status=task_status)
    scope.cancel()
