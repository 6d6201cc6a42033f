"""`sr worker`: serve one model on one device over a Unix socket or loopback TCP.

Prints one JSON line on stdout once listening (`{"listening": ..., "port": ...}`), so a
caller that asked for port 0 learns the port. Logs go to stderr in `--log-format` (the
router's rule: the flag, else SR_LOG_FORMAT, else text on a terminal and json elsewhere;
sr.logs), every line stamped with the worker's pid and, when given, `--deployment`
and `--replica`: a worker names itself, so its lines say whose they are wherever they end
up (a managed worker's are relayed by its router, an attached one's are its operator's).
SIGTERM or SIGINT stops gracefully: no new connections, in-flight requests finish
(bounded). `--parent-fd N` ties the worker's life to a supervisor's (sr.worker.parent_watch).
A `--host` other than loopback needs an API key (`--api-key` or SR_WORKER_API_KEY), which
every route but /health and /health/live then requires (sr.worker.auth).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys

import attrs
import trio

from sr.collector import imports_uncollected
from sr.config.arguments import OneLineArgumentParser
from sr.config.engine import add_engine_flags, engine_from_flags
from sr.errors import UsageError
from sr.events import EventSink
from sr.logs import LOG_FORMATS, configure_logging, resolve_log_format
from sr.settings import Settings, read_process_settings
from sr.traces import require_sdk
from sr.worker import auth
from sr.worker.allocator import configure_malloc
from sr.worker.options import WorkerOptions
from sr.worker.parent_watch import watch_parent_fd


def _parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(prog="sr worker", add_help=True)
    # --artifact, --profile, --max-tokens, --dtype ...: the deployment's engine arguments,
    # one flag per EngineArgs field, as the pool writes them (sr.config.engine)
    add_engine_flags(p)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--uds")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--parent-fd", type=int, metavar="N")
    p.add_argument("--log-format", choices=LOG_FORMATS)
    p.add_argument("--deployment", help="deployment this worker serves (stamped on its logs)")
    p.add_argument("--replica", help="replica id this worker is (stamped on its logs)")
    p.add_argument(
        "--api-key",
        help=f"key callers must send as Authorization: Bearer (or {auth.ENV_VAR}, preferred:"
        " a flag shows in ps); required with a --host other than loopback",
    )
    return p


@attrs.frozen
class WorkerCommand:
    """A parsed `sr worker` command line."""

    options: WorkerOptions
    listen: dict
    parent_fd: int | None  # None when not given
    log_format: str
    log_context: dict  # deployment, replica and pid: stamped on every log line
    api_key: str | None = attrs.field(default=None, repr=False)  # sr.worker.auth; never shown


def parse_args(argv: list[str]) -> tuple[WorkerOptions, dict]:
    command = parse_command(argv)
    return command.options, command.listen


def parse_command(argv: list[str], settings: Settings | None = None) -> WorkerCommand:
    """`settings`: this process's (sr.settings; default: read now)."""
    settings = settings if settings is not None else read_process_settings()
    args = _parser().parse_args(argv)
    if args.uds and (args.host or args.port is not None):
        raise UsageError("give either --uds PATH or --host/--port, not both")
    if not args.uds and args.port is None:
        raise UsageError("one of --uds PATH or --port P is required")
    if args.port is not None and not 0 <= args.port <= 65535:
        raise UsageError(f"--port: must be 0..65535, got {args.port}")
    options = WorkerOptions(
        **engine_from_flags(args),
        device=args.device,
        threads=args.threads,
        fault_injection=settings.fault_injection,
        traces=settings.traces,
    )
    options.validate()
    if options.traces is not None:
        require_sdk()  # one line naming the `otel` extra, before anything loads
    listen = (
        {"uds": args.uds} if args.uds else {"host": args.host or "127.0.0.1", "port": args.port}
    )
    api_key = auth.worker_key(args.api_key, settings.environ, tcp="port" in listen)
    if "host" in listen and (problem := auth.required_key_problem(listen["host"], api_key)):
        raise UsageError(problem)
    context = {"deployment": args.deployment, "replica": args.replica, "pid": os.getpid()}
    return WorkerCommand(
        options=options,
        listen=listen,
        parent_fd=_parent_fd(args.parent_fd),
        log_format=resolve_log_format(args.log_format, settings.environ, sys.stderr),
        log_context={key: value for key, value in context.items() if value is not None},
        api_key=api_key,
    )


def _parent_fd(fd: int | None) -> int | None:
    if fd is None:
        return None
    if fd < 0:
        raise UsageError(f"--parent-fd: must be >= 0, got {fd}")
    try:
        os.fstat(fd)
    except OSError:
        raise UsageError(f"--parent-fd: {fd} is not an open file descriptor") from None
    return fd


def main(argv: list[str]) -> int:
    try:
        settings = read_process_settings()  # the one read of the environment
        command = parse_command(argv, settings)
    except UsageError as error:
        print(f"sr worker: {error}", file=sys.stderr)
        return 2
    options, listen = command.options, command.listen
    if command.parent_fd is not None:
        # Before torch is imported (sr.worker.service): a parent that dies while we load
        # must not leave us loading a model for nobody.
        watch_parent_fd(command.parent_fd)
    configure_logging(log_format=command.log_format, context=command.log_context, worker=True)
    malloc = configure_malloc(
        settings.environ
    )  # before the model's first batch (sr.worker.allocator)
    if malloc != "tuned":
        logging.getLogger("sr.worker").info("malloc: %s", malloc)
    listening: list[str] = []  # filled once the socket is bound
    try:
        trio.run(_run, options, listen, settings.adaptive_threads, listening, command.api_key)
    except (UsageError, OSError, BaseExceptionGroup) as error:
        # Trio nurseries wrap what escapes them in (nested) ExceptionGroups; a startup
        # failure is one leaf in there and deserves one line, not a traceback.
        usage = _leaf(error, UsageError)
        if usage is not None:
            print(f"sr worker: {usage}", file=sys.stderr)
            return 2
        bind_error = _leaf(error, OSError)
        if bind_error is None or listening:
            raise
        reason = bind_error.strerror or str(bind_error)
        print(f"sr worker: cannot listen on {_bind_name(listen)}: {reason}", file=sys.stderr)
        return 1
    return 0


def _leaf(error: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The first `kind` inside `error`, when that is all `error` holds (else None)."""
    if isinstance(error, BaseExceptionGroup):
        matched, rest = error.split(kind)
        if matched is None or rest is not None:
            return None
        while isinstance(matched, BaseExceptionGroup):
            matched = matched.exceptions[0]
        return matched
    return error if isinstance(error, kind) else None


def _bind_name(listen: dict) -> str:
    if "uds" in listen:
        return f"unix:{listen['uds']}"
    host = listen["host"]
    return f"[{host}]:{listen['port']}" if ":" in host else f"{host}:{listen['port']}"


async def _run(
    options: WorkerOptions,
    listen: dict,
    adaptive: int,
    listening: list[str],
    api_key: str | None = None,
) -> None:
    # A spawned worker imports torch here, without full collections (sr.collector); a forked
    # one finds these modules imported and only freezes what it has made so far.
    with imports_uncollected():
        from sr.worker.http import serve_worker
        from sr.worker.service import WorkerService

    events = EventSink()
    service = WorkerService(options, events=events, adaptive_mode=adaptive)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:

        async def until_signal() -> None:
            async for signum in signals:
                events.emit("worker_stopping", signal=signal.Signals(signum).name)
                return

        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                lambda task_status: serve_worker(
                    service,
                    shutdown_trigger=until_signal,
                    task_status=task_status,
                    api_key=api_key,
                    **listen,
                )
            )
            listening.extend(binds)
            port = None
            if "port" in listen:
                port = int(binds[0].rsplit(":", 1)[1])
            print(json.dumps({"listening": binds[0], "port": port}), flush=True)
            events.emit("worker_listening", binds=binds, fault_injection=options.fault_injection)
