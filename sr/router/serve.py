"""`sr serve` runtime and the embeddable `serve`.

`serve(config)` binds its listener first (a port that is taken, a host that does not
resolve: one StartupFailed naming the address and the cause, before any worker starts),
opens the pool, serves at once (so /health and /startup-status answer while workers load;
/ready is 503 until every deployment has a ready replica), waits for readiness, and serves
until its handle's `shutdown()` (graceful: stop accepting, finish in-flight requests,
then drain and stop every worker) or until it is cancelled.
`task_status.started(handle)` fires once the socket is listening, not once ready: an
embedding program can then watch startup over HTTP or `await handle.core.wait_ready(...)`.

`run_sr_serve` is the process around it: logs on stderr in one format, text or JSON
(sr.logs), milestones on stdout (sr.router.startup), SIGINT/SIGTERM drain and exit 0,
SIGHUP reloads the config file, startup failure exits 1.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

import attrs
import trio

from sr.config.schema import Listener, SrConfig
from sr.errors import ConfigError, RequestError, SrError, StartupFailed, UsageError
from sr.events import EventSink
from sr.http.asgi_adapter import AsgiAdapter
from sr.http.limits import HttpLimits
from sr.http.server import H1Server, error_answer, open_listeners
from sr.logs import AccessLog, configure_logging, resolve_log_format
from sr.router.app import RouterApp
from sr.router.cache import ResultCache
from sr.router.metrics import RouterMetrics
from sr.router.reload import ConfigReloader
from sr.router.startup import StartupProgress, replica_counts
from sr.settings import Settings, read_process_settings

if TYPE_CHECKING:  # imported when serving: sr.pool is not loaded by importing this module
    from sr.pool.supervisor import Supervisor

# In-flight HTTP requests get this long to finish after shutdown() before they are cut.
HTTP_GRACE_S = 10.0


@attrs.define(eq=False)
class ServingRouter:
    """What `nursery.start(serve, config)` returns: the listening URL and the live pool."""

    url: str
    core: Supervisor  # typed helpers: embed, classify, decide, rerank (docs/python-api.md)
    app: RouterApp
    reloader: ConfigReloader | None
    _stop: trio.Event = attrs.field(factory=trio.Event, alias="stop")

    def shutdown(self) -> None:
        """Begin a graceful stop; `serve` returns once workers are stopped."""
        self._stop.set()


# The front door's HTTP limits (sr.http.limits; docs/security.md). The app reads bodies
# itself (sr.http.asgi.read_body) with the same body cap and timeout.
ROUTER_HTTP_LIMITS = HttpLimits(graceful_timeout_s=HTTP_GRACE_S)


async def serve(
    config: SrConfig,
    *,
    config_path: str | os.PathLike[str] | None = None,
    host: str | None = None,
    port: int | None = None,
    events: EventSink | None = None,
    threads: int | None = None,
    in_process: bool = False,
    ready_timeout_s: float | None = None,
    open_router: Callable[..., Any] | None = None,
    out: TextIO | None = None,
    access_log: AccessLog | None = None,
    settings: Settings | None = None,
    on_bound: Callable[[], None] | None = None,
    task_status: trio.TaskStatus[ServingRouter] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `config` over HTTP until shut down or cancelled; raises SrError on startup failure.

    `settings`: the environment, parsed (sr.settings; default: read now: a malformed
    variable is a UsageError before anything starts). `ready_timeout_s=None` takes
    VLLM_SRUN_READY_TIMEOUT from them (default 10m). `out` takes the milestone lines
    (stdout); `access_log` the request lines (default: none). `on_bound` runs once the
    listener is bound, before any worker starts (`sr serve` writes its config file there).
    """
    settings = settings if settings is not None else read_process_settings()
    events = events if events is not None else EventSink()
    access_log = access_log if access_log is not None else AccessLog()
    listener = config.listeners[0] if config.listeners else Listener()
    host = host or listener.host
    port = listener.port if port is None else port
    cache = ResultCache(settings.result_cache_entries)
    if threads is None and not in_process:
        from sr.pool.supervisor import default_worker_threads

        threads = default_worker_threads(settings)
    if ready_timeout_s is None:
        ready_timeout_s = settings.ready_timeout_s
    progress = StartupProgress(out)
    events.subscribe(progress.on_event)
    events.subscribe(cache.on_event)
    if open_router is None:
        from sr.pool import open_router
    tracing = None
    if settings.traces is not None:  # sr.router.tracing: imported only with traces on
        from sr.router.tracing import RouterTracing

        tracing = RouterTracing.open(settings.traces)
    listeners, binds = await _bind(host, port)  # before any worker starts
    try:
        if on_bound is not None:
            on_bound()
        async with open_router(
            config, events=events, in_process=in_process, threads=threads, settings=settings
        ) as core:
            # The deployments are read at each scrape: a reload shows in sr_model_info.
            metrics = RouterMetrics(
                core.inventory,
                deployments=lambda: core.config.deployments,
                served_dtype=core.served_dtype,
            )
            events.subscribe(metrics.on_event)
            app = RouterApp(
                core, config, metrics=metrics, cache=cache,
                max_body_bytes=ROUTER_HTTP_LIMITS.max_body_bytes,
                body_timeout_s=ROUTER_HTTP_LIMITS.body_timeout_s, access_log=access_log,
                fault_injection=settings.fault_injection, tracing=tracing,
            )  # fmt: skip
            reloader = None
            if config_path is not None:
                reloader = ConfigReloader(
                    core, config_path, current=config, adopt=app.apply_config, events=events,
                    sources=settings.models,
                )  # fmt: skip
                app.set_reload(reloader.reload)
            stop = trio.Event()
            failure: list[SrError] = []
            async with trio.open_nursery() as nursery:
                await nursery.start(_serve_http, app, listeners, stop, nursery.cancel_scope)
                url = binds[0]
                handle = ServingRouter(url=url, core=core, app=app, reloader=reloader, stop=stop)
                events.emit("router_listening", url=url)
                progress.listening(url)
                task_status.started(handle)
                try:
                    await core.wait_ready(ready_timeout_s)
                except SrError as error:
                    failure.append(error)
                    events.emit("startup_failed", error=str(error))
                    handle.shutdown()
                else:
                    progress.ready(url, lambda: replica_counts(core.inventory()))
                    events.emit("router_ready", url=url)
            if failure:
                raise failure[0]
    finally:
        with trio.CancelScope(shield=True):
            for listener in listeners:  # closed already if the server ran; idempotent
                await listener.aclose()
            if tracing is not None:  # bounded (sr.traces): a hung collector cannot hold us
                await trio.to_thread.run_sync(tracing.shutdown)


async def _bind(host: str, port: int) -> tuple[list[trio.abc.Listener], list[str]]:
    try:
        return await open_listeners(host=host, port=port)
    except OSError as error:  # taken, not permitted, not resolvable (gaierror), ...
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        cause = error.strerror or str(error) or type(error).__name__
        raise StartupFailed(f"cannot listen on {shown}: {cause}") from None


async def _serve_http(
    app: RouterApp,
    listeners: list[trio.abc.Listener],
    stop: trio.Event,
    done: trio.CancelScope,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """sr's HTTP/1.1 server until `stop` (graceful: in-flight requests finish within
    HTTP_GRACE_S), then end the serve. `task_status.started()` once serving."""
    crash = error_answer(RequestError("the router failed to answer"))
    server = H1Server(adapter=AsgiAdapter(app, crash_answer=crash), limits=ROUTER_HTTP_LIMITS)
    async with trio.open_nursery() as nursery:
        await nursery.start(functools.partial(server.serve, listeners, shutdown_trigger=stop.wait))
        task_status.started()
    done.cancel()


def run_sr_serve(
    config: SrConfig,
    *,
    config_path: str | os.PathLike | None,
    host: str | None,
    port: int | None,
    threads: int | None,
    log_format: str | None = None,
    access_log: bool = False,
    settings: Settings | None = None,
    write_config: Callable[[], None] | None = None,
) -> int:
    """The `sr serve` process: 0 after a signal-driven stop, 1 when startup fails, 2 for a
    bad setting found before anything started. `log_format` None: SR_LOG_FORMAT, else text
    on a terminal, json elsewhere (sr.logs). `settings`: as `sr serve` read them
    (default: read now). `write_config` runs once the listener is bound."""
    try:
        settings = settings if settings is not None else read_process_settings()
        log_format = resolve_log_format(log_format, settings.environ, sys.stderr)
    except UsageError as error:
        print(f"sr serve: error: {error}", file=sys.stderr, flush=True)
        return 2
    configure_logging(log_format=log_format)
    requests = AccessLog(enabled=access_log)
    try:
        return trio.run(
            _run_process, config, config_path, host, port, threads, requests, settings,
            write_config,
        )  # fmt: skip
    except KeyboardInterrupt:  # Ctrl-C before the signal receiver was installed
        return 0


class _Started:
    """A task_status that hands the ServingRouter to the signal loop."""

    def __init__(self) -> None:
        self.handle: ServingRouter | None = None
        self.event = trio.Event()

    def started(self, value: ServingRouter) -> None:
        self.handle = value
        self.event.set()


async def _run_process(
    config: SrConfig,
    config_path: str | os.PathLike | None,
    host: str | None,
    port: int | None,
    threads: int | None,
    access_log: AccessLog,
    settings: Settings,
    write_config: Callable[[], None] | None,
) -> int:
    failure: list[BaseException] = []
    started = _Started()
    wanted = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    with trio.open_signal_receiver(*wanted) as signals:
        async with trio.open_nursery() as nursery:

            async def serve_then_stop() -> None:
                try:
                    await serve(
                        config, config_path=config_path, host=host, port=port,
                        threads=threads, access_log=access_log, settings=settings,
                        on_bound=write_config, task_status=started,
                    )  # fmt: skip
                except (SrError, OSError) as error:
                    failure.append(error)
                finally:
                    nursery.cancel_scope.cancel()

            nursery.start_soon(serve_then_stop)
            nursery.start_soon(_handle_signals, signals, started, nursery)
    if failure and isinstance(failure[0], UsageError):
        print(f"sr serve: error: {_one_line(failure[0])}", file=sys.stderr, flush=True)
        return 2
    if failure:
        print(f"sr serve: startup failed: {_one_line(failure[0])}", file=sys.stderr, flush=True)
        return 1
    return 0


async def _handle_signals(signals: Any, started: _Started, nursery: trio.Nursery) -> None:
    stopping = False
    async for signum in signals:
        if signum == signal.SIGHUP:
            nursery.start_soon(_reload_on_hangup, started.handle)
        elif stopping or started.handle is None:
            # A second Ctrl-C, or one before listening: stop now. The pool's exit still
            # stops every worker it started.
            nursery.cancel_scope.cancel()
        else:
            stopping = True
            print("sr: stopping (draining requests and workers)", flush=True)
            started.handle.shutdown()


async def _reload_on_hangup(handle: ServingRouter | None) -> None:
    if handle is None or handle.reloader is None:
        print("sr: SIGHUP ignored: no config file to reload", file=sys.stderr, flush=True)
        return
    try:
        summary = await handle.reloader.reload()
    except RequestError as error:
        print(f"sr: reload failed: {error.message}", file=sys.stderr, flush=True)
        return
    counts = ", ".join(f"{name}={d['replicas']}" for name, d in summary["deployments"].items())
    print(f"sr: config reloaded ({counts})", flush=True)


def _one_line(error: BaseException) -> str:
    if isinstance(error, ConfigError):
        return "; ".join(str(issue) for issue in error.issues)
    text = str(error) or type(error).__name__
    return " ".join(text.split())
