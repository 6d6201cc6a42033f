"""`sr serve`: turn flags into the canonical config, write it, hand over to the router.

    sr serve [MODEL] [-e|--engine] [--platform auto|cpu|cuda|rocm] [-dp N]
             [--device-ids IDS] [--config FILE] [--host H] [--port P] [--threads N]
             [--dtype float32|bfloat16|float16] [--dry-run] [--download]
             [--log-format text|json] [--access-log] [--otlp-endpoint URL]

The config file is the only state: flags are applied to it (creating the default config
when the file is missing; `--host`/`--port` land on its first listener), the result is
validated, and written atomically, only when it changed and only once the listener is bound
(a port in use is `startup failed`, exit status 1, with the file as it was). Usage errors
are one line on stderr and exit status 2, with the file left byte-for-byte as it was (a
config with several issues lists them all on that line, joined by "; "). `--threads` above
the CPU budget is capped at it silently, exactly like `VLLM_SRUN_CPU_THREADS`. `--dtype` is
written into the default deployment, like MODEL: an engine arg of the config, not a
run-time setting.

`--download` fetches, before the config is written and before any worker starts, every
Hugging Face artifact of a managed deployment that does not resolve offline
(sr.models.download); a failed download is one `startup failed` line, exit status 1, with
the file left as it was. Without it sr never downloads. `--dry-run` downloads nothing.

`--log-format` is the one log setting (default: SR_LOG_FORMAT, else text when stderr is a
terminal, json otherwise; sr.logs); `--access-log` adds one log line per request.
`--otlp-endpoint URL` turns traces on (sr.traces): spans go to the OTLP/HTTP collector at
URL (`/v1/traces` appended unless it ends so), as OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, which the
flag sets in the environment the workers start with; without the `otel` extra installed,
asking for traces is a usage error naming it.
None of these is written to the config: they are about this process, not about what it serves.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from sr.config.arguments import OneLineArgumentParser, bounded_int, report_usage_error
from sr.config.cli import issue_line
from sr.config.load import dump_config, load_config, validate, write_config_atomic
from sr.config.placement import PLATFORM_CHOICES, ServeFlags, apply_flags
from sr.config.schema import DEPLOYMENT_DTYPES, MAX_REPLICAS, SrConfig, default_config
from sr.devices import cpu_budget, gpu_inventory
from sr.errors import ConfigError, ConfigIssue, StartupFailed, UsageError
from sr.logs import LOG_FORMATS, resolve_log_format
from sr.models.limits import settle_input_limits
from sr.pool import fork_start
from sr.settings import Settings, flag_variables, read_process_settings
from sr.traces import TRACES_ENDPOINT_ENV, check_url, require_sdk, traces_url

PROG = "sr serve"


def _parser() -> OneLineArgumentParser:
    p = OneLineArgumentParser(prog=PROG, description="Serve the models of the sr config.")
    p.add_argument("model", nargs="?", metavar="MODEL", help="artifact of the default deployment")
    p.add_argument("-e", "--engine", action="store_true", help="write global.router.enabled: false")
    p.add_argument("--platform", choices=PLATFORM_CHOICES, default="auto")
    p.add_argument(
        "-dp",
        dest="data_parallel",
        type=bounded_int(1, MAX_REPLICAS),
        metavar="N",
        help=f"workers of the default deployment (1..{MAX_REPLICAS})",
    )
    p.add_argument("--device-ids", metavar="IDS", help="host GPU indices, comma-separated")
    p.add_argument("--config", default="config.yaml", help="default: ./config.yaml")
    p.add_argument("--host", help="listener host (default: from the config)")
    p.add_argument("--port", type=bounded_int(0, 65535), help="listener port")
    p.add_argument("--threads", type=bounded_int(1), help="CPU threads per managed worker")
    p.add_argument("--dtype", choices=DEPLOYMENT_DTYPES, help="precision of the default deployment")
    p.add_argument(
        "--dry-run", action="store_true", help="print the resulting config; write nothing"
    )
    p.add_argument(
        "--download",
        action="store_true",
        help="fetch missing Hugging Face artifacts into the hub cache before starting",
    )
    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        help="stderr log lines (default: SR_LOG_FORMAT, else text on a terminal, json otherwise)",
    )
    p.add_argument("--access-log", action="store_true", help="log one line per request")
    p.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help="send traces to this OTLP/HTTP collector (default: OTEL_EXPORTER_OTLP_ENDPOINT)",
    )
    return p


def _issues_line(path: Path, issues: list[ConfigIssue]) -> str:
    """Every issue on one line, the config file named once at the front."""
    if not issues:
        return f"{path}: invalid config"
    first, *rest = issues
    return "; ".join([issue_line(path, first), *(str(issue) for issue in rest)])


def _apply_dtype(cfg: SrConfig, dtype: str) -> None:
    """`--dtype`: the default deployment's precision (`cfg` is apply_flags' fresh copy)."""
    name = cfg.default_deployment
    deployment = cfg.deployments.get(name)
    if deployment is None:
        raise UsageError(
            f"the default deployment {name!r} (global.model_catalog.system.decision_model"
            ".deployment) is not in the config; edit the config"
        )
    deployment.dtype = dtype


def _with_traces(settings: Settings, endpoint: str | None, *, process_env: bool) -> Settings:
    """`--otlp-endpoint` written into the settings' environment (so workers start with it
    too) and, when they are this process's (`process_env`), into it (a reload reads the
    environment again); UsageError when traces are asked for and the SDK is missing."""
    if endpoint is not None:
        url = traces_url(check_url(endpoint.strip(), "--otlp-endpoint"))
        settings = Settings.from_environ({**settings.environ, TRACES_ENDPOINT_ENV: url})
        if process_env:
            flag_variables({TRACES_ENDPOINT_ENV: url})
    if settings.traces is not None:
        require_sdk()
    return settings


def _would_not_validate(issues: list[ConfigIssue]) -> UsageError:
    return UsageError(f"the result would not validate: {'; '.join(map(str, issues))}")


def main(argv: list[str] | None = None, *, env: Mapping[str, str] | None = None) -> int:
    """`env`: the environment to read (default: this process's; sr.settings)."""
    try:
        settings = read_process_settings() if env is None else Settings.from_environ(env)
        args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
        if args.host is not None and not args.host.strip():
            raise UsageError("argument --host: must not be empty")
        log_format = resolve_log_format(args.log_format, settings.environ, sys.stderr)
        settings = _with_traces(settings, args.otlp_endpoint, process_env=env is None)
    except UsageError as exc:
        return report_usage_error(PROG, exc)

    path = Path(args.config)
    flags = ServeFlags(
        model=args.model,
        engine=args.engine,
        platform=args.platform,
        data_parallel=args.data_parallel,
        device_ids=args.device_ids,
        host=args.host,
        port=args.port,
    )
    exists = path.exists()
    try:
        current = load_config(path) if exists else default_config()
        inventory = gpu_inventory(settings.environ) if flags.places else []
        new = apply_flags(current, flags, inventory, settings.environ)
        if args.dtype is not None:
            _apply_dtype(new, args.dtype)
        settle_input_limits(new, settings.models)
    except UsageError as exc:
        return report_usage_error(PROG, exc)
    except ConfigError as exc:
        return report_usage_error(PROG, UsageError(_issues_line(path, exc.issues)))
    if issues := validate(new):
        return report_usage_error(PROG, _would_not_validate(issues))
    if args.dry_run:
        sys.stdout.write(dump_config(new))
        return 0
    if args.download:
        # Before the config is written: a failed download leaves the file as it was.
        from sr.models.download import DownloadFailed, download_missing

        try:
            download_missing(new, sources=settings.models)
        except DownloadFailed as exc:
            print(f"{PROG}: startup failed: {' '.join(str(exc).split())}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print(f"{PROG}: startup failed: download interrupted", file=sys.stderr)
            return 1
        try:  # the folders fetched now have their limits too
            settle_input_limits(new, settings.models)
        except UsageError as exc:
            return report_usage_error(PROG, exc)
        if issues := validate(new):
            return report_usage_error(PROG, _would_not_validate(issues))
    wrote = not exists or new != current

    def write_config() -> None:
        """Called once the listener is bound: a port in use leaves the file as it was."""
        if wrote:
            try:
                write_config_atomic(path, new)
            except OSError as exc:
                raise StartupFailed(f"cannot write {path}: {exc.strerror or exc}") from None

    # The fork server imports torch for about a second: started now, it does so while the
    # router imports its own code and binds (sr.pool.fork_start).
    fork_start.prestart(new, settings.environ)
    try:
        return _run(new, path, write_config, wrote, args, log_format, settings)
    finally:
        fork_start.discard()  # one the pool did not adopt


def _run(new: SrConfig, path: Path, write_config, wrote: bool, args, log_format: str,
         settings: Settings) -> int:  # fmt: skip
    try:
        from sr.router.serve import run_sr_serve
    except ImportError:
        try:
            write_config()
        except StartupFailed as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 1
        state = "written to" if wrote else "unchanged at"
        print(
            f"{PROG}: config {state} {path}; the router is not available in this build",
            file=sys.stderr,
        )
        return 1
    # Capped like VLLM_SRUN_CPU_THREADS: more threads than CPUs only oversubscribes them.
    threads = None if args.threads is None else min(args.threads, cpu_budget())
    return run_sr_serve(
        new,
        config_path=path,
        host=None,  # both are in `new` now
        port=None,
        write_config=write_config,
        threads=threads,
        log_format=log_format,
        access_log=args.access_log,
        settings=settings,
    )
