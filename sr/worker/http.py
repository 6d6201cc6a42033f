"""The worker's HTTP face: a plain ASGI callable over `WorkerService.handle`, served by
hypercorn under Trio on a Unix socket (private 0700 folder) or loopback TCP."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from sr.asgi import ClientDisconnected, read_body, request_headers, serve_lifespan
from sr.errors import RequestError, UsageError
from sr.private_folder import ensure_private_folder
from sr.worker.service import JSON_HEADERS, WorkerService
from sr.worker.validation import MAX_BODY_BYTES

GRACEFUL_TIMEOUT_S = 5.0


def asgi_app(service: WorkerService):
    async def app(scope, receive, send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await serve_lifespan(receive, send)
            return
        if kind != "http":
            return
        (content_length,) = request_headers(scope, b"content-length")
        try:
            body = await read_body(receive, content_length, MAX_BODY_BYTES)
        except ClientDisconnected:
            return  # nobody is left to read an answer
        except RequestError as error:  # too large, too slow, bad Content-Length
            status, headers, payload = error.status, JSON_HEADERS, error.body()
        else:
            status, headers, payload = await service.handle(scope["method"], scope["path"], body)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [*headers, (b"content-length", str(len(payload)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": payload})
        if service.exit_requested:
            service.exit_process(1)

    return app


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
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen at once, then load the model; stops gracefully when `shutdown_trigger` returns.

    `task_status.started(binds)` reports where it listens (e.g. `http://127.0.0.1:41234`).
    """
    config = Config()
    config.graceful_timeout = GRACEFUL_TIMEOUT_S
    config.keep_alive_timeout = 75.0  # the router keeps its UDS connections open
    config.accesslog = None
    config.errorlog = None
    config.include_server_header = False
    if uds is not None:
        prepare_uds(uds)
        config.bind = [f"unix:{uds}"]
    else:
        config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        binds = await nursery.start(
            _serve_then_stop,
            asgi_app(service),
            config,
            shutdown_trigger or trio.sleep_forever,
            nursery.cancel_scope,
        )
        task_status.started(binds)
    if uds is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(uds)


async def _serve_then_stop(app, config, shutdown_trigger, scope, *, task_status) -> None:
    # hypercorn drains in-flight requests (graceful_timeout) before `serve` returns; only then
    # is the engine cancelled, so requests already accepted get their answers.
    await serve(app, config, shutdown_trigger=shutdown_trigger, task_status=task_status)
    scope.cancel()
