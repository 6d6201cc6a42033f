"""Traces, opt-in: which collector and sampler (from the environment), and the SDK behind them.

Rules:
- Off unless an OTLP endpoint is named: `sr serve --otlp-endpoint URL` (which the CLI
  writes into the environment its workers start with), or OpenTelemetry's own
  `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the whole URL) / `OTEL_EXPORTER_OTLP_ENDPOINT` (a
  base, `/v1/traces` appended), as every OpenTelemetry SDK reads them. `OTEL_SDK_DISABLED=true`
  turns them off again. `TraceSettings.from_environ` reads these variables off the settings'
  snapshot (sr.settings); a malformed one is a UsageError naming it.
- The SDK (`opentelemetry-sdk` and its OTLP/HTTP exporter, the `otel` extra) is imported
  only by `open_tracing`, which only a process with traces on calls: the router's and the
  workers' request paths never import it otherwise. Without the extra, asking for traces is
  one line naming it.
- Spans leave in batches from the SDK's own thread (BatchSpanProcessor): a request only
  appends its ended spans to a bounded queue, so a collector that is down or hangs costs
  dropped spans, never a slower or failed request (nor a log line per dropped span: one a
  minute says it). `Tracing.shutdown` waits a bounded time.
- Where the SDK reads its own variables (OTEL_EXPORTER_OTLP_TRACES_HEADERS, _CERTIFICATE,
  _COMPRESSION, OTEL_RESOURCE_ATTRIBUTES, the batch processor's OTEL_BSP_*), it reads them
  itself, as the libraries under torch read theirs.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import attrs

from sr.errors import UsageError

TRACES_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
SERVICE_NAME_ENV = "OTEL_SERVICE_NAME"
SAMPLER_ENV = "OTEL_TRACES_SAMPLER"
SAMPLER_ARG_ENV = "OTEL_TRACES_SAMPLER_ARG"
SDK_DISABLED_ENV = "OTEL_SDK_DISABLED"
TRACES_PATH = "/v1/traces"
DEFAULT_SERVICE_NAME = "sr"
# OpenTelemetry's default: follow the caller's decision, sample a trace that starts here.
DEFAULT_SAMPLER = "parentbased_always_on"
SAMPLERS = (
    "always_on", "always_off", "traceidratio",
    "parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio",
)  # fmt: skip
MISSING_EXTRA = "traces need the otel extra: pip install 'sr[otel]'"
# One export's wait for the collector (the SDK's default is 10 s); on the SDK's thread.
EXPORT_TIMEOUT_S = 5.0
SHUTDOWN_TIMEOUT_S = 2.0  # how long a stopping process waits for its last spans to leave
TRACEPARENT = "traceparent"
# The SDK's batch processor logs through this logger (a dropped span, a failed export).
_BATCH_PROCESSOR_LOGGER = "opentelemetry.sdk._shared_internal"
DROP_LOG_MUTE_S = 60.0


def traces_url(base: str) -> str:
    """A collector's base URL as its traces endpoint (`/v1/traces` appended, as the SDKs
    do for OTEL_EXPORTER_OTLP_ENDPOINT); a URL already ending in it is kept."""
    stripped = base.rstrip("/")
    return stripped if stripped.endswith(TRACES_PATH) else stripped + TRACES_PATH


def check_url(url: str, name: str) -> str:
    """`url` if it is an http(s) URL with a host; else UsageError naming `name`."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{name}: expected an http:// or https:// URL, got {url!r}")
    return url


@attrs.frozen
class TraceSettings:
    """Where spans go and which are kept (module docstring)."""

    endpoint: str  # the URL spans are posted to (OTLP/HTTP, protobuf)
    service_name: str = DEFAULT_SERVICE_NAME
    sampler: str = DEFAULT_SAMPLER
    ratio: float = 1.0  # the traceidratio samplers' argument

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> TraceSettings | None:
        """The trace settings `env` names, None when traces are off."""
        if (env.get(SDK_DISABLED_ENV) or "").strip().lower() == "true":
            return None
        if env.get(TRACES_ENDPOINT_ENV, "").strip():
            endpoint = check_url(env[TRACES_ENDPOINT_ENV].strip(), TRACES_ENDPOINT_ENV)
        elif env.get(ENDPOINT_ENV, "").strip():
            endpoint = traces_url(check_url(env[ENDPOINT_ENV].strip(), ENDPOINT_ENV))
        else:
            return None
        sampler = (env.get(SAMPLER_ENV) or DEFAULT_SAMPLER).strip().lower()
        if sampler not in SAMPLERS:
            raise UsageError(
                f"{SAMPLER_ENV}: must be one of {', '.join(SAMPLERS)}, got {sampler!r}"
            )
        ratio = 1.0
        raw_ratio = (env.get(SAMPLER_ARG_ENV) or "").strip()
        if sampler.endswith("traceidratio") and raw_ratio:
            try:
                ratio = float(raw_ratio)
            except ValueError:
                ratio = -1.0
            if not 0.0 <= ratio <= 1.0:
                raise UsageError(
                    f"{SAMPLER_ARG_ENV}: must be a number from 0 to 1, got {raw_ratio!r}"
                )
        service = (env.get(SERVICE_NAME_ENV) or "").strip() or DEFAULT_SERVICE_NAME
        return cls(endpoint=endpoint, service_name=service, sampler=sampler, ratio=ratio)


def traceparent_of(span: Any) -> str:
    """W3C `traceparent` naming `span` as the parent of what a callee does."""
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def parent_context(traceparent: str | None, tracestate: str | None = None) -> Any:
    """The OpenTelemetry context a caller's `traceparent` (and `tracestate`) names; None
    (a new trace) when there is none or it is malformed, as the W3C rules ask."""
    if not traceparent:
        return None
    carrier = {TRACEPARENT: traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    return _propagator().extract(carrier)


@functools.cache
def _propagator() -> Any:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


def require_sdk() -> None:
    """UsageError naming the `otel` extra unless the SDK and its exporter are installed
    (found, not imported: `sr serve` checks before anything starts)."""
    from importlib.util import find_spec

    for name in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"):
        try:
            found = find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            raise UsageError(MISSING_EXTRA)


class Tracing:
    """One process's tracer: spans of `component` (router or worker) exported in batches
    to the settings' endpoint. Built by `open_tracing`."""

    def __init__(self, tracer: Any, processor: Any, service_name: str) -> None:
        self.tracer = tracer
        self.service_name = service_name
        self._processor = processor

    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Send what is queued, waiting at most `timeout_s`: the SDK's own shutdown waits up
        to 30 s on a hung collector, so it runs on a daemon thread that is left behind."""
        stopping = threading.Thread(
            target=self._processor.shutdown, name="sr-traces-shutdown", daemon=True
        )
        stopping.start()
        stopping.join(timeout_s)


def open_tracing(
    settings: TraceSettings, *, service_name: str, attributes: Mapping[str, str] | None = None
) -> Tracing:
    """The SDK set up for `settings` (its resource: `service_name` and `attributes`);
    UsageError naming the `otel` extra when the SDK is not installed."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise UsageError(MISSING_EXTRA) from None
    from sr import __version__

    resource = Resource.create(
        {"service.name": service_name, "service.version": __version__, **(attributes or {})}
    )
    # shutdown_on_exit=False: the SDK's own exit hook would wait up to 30 s on a hung
    # collector; the process calls Tracing.shutdown, bounded, instead.
    provider = TracerProvider(resource=resource, sampler=_sampler(settings), shutdown_on_exit=False)
    processor = BatchSpanProcessor(
        OTLPSpanExporter(endpoint=settings.endpoint, timeout=EXPORT_TIMEOUT_S)
    )
    provider.add_span_processor(processor)
    _quiet_drops()
    return Tracing(provider.get_tracer("sr", __version__), processor, service_name)


class _MuteDropsForAMinute(logging.Filter):
    """The batch processor warns on every span it drops while its queue is full (a
    collector down or hung): a log record made for every span of every request. The first
    one is logged; then the processor's logger is muted for a minute (its level, so that
    no record is even made), and the next drop after that is logged again."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__()
        self._logger = logger

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("Queue full"):
            self._logger.setLevel(logging.ERROR)
            unmute = threading.Timer(DROP_LOG_MUTE_S, self._logger.setLevel, (logging.NOTSET,))
            unmute.daemon = True
            unmute.start()
        return True


def _quiet_drops() -> None:
    logger = logging.getLogger(_BATCH_PROCESSOR_LOGGER)
    if not any(isinstance(f, _MuteDropsForAMinute) for f in logger.filters):
        logger.addFilter(_MuteDropsForAMinute(logger))


def _sampler(settings: TraceSettings) -> Any:
    from opentelemetry.sdk.trace import sampling

    by_name = {
        "always_on": lambda: sampling.ALWAYS_ON,
        "always_off": lambda: sampling.ALWAYS_OFF,
        "traceidratio": lambda: sampling.TraceIdRatioBased(settings.ratio),
        "parentbased_always_on": lambda: sampling.ParentBased(sampling.ALWAYS_ON),
        "parentbased_always_off": lambda: sampling.ParentBased(sampling.ALWAYS_OFF),
        "parentbased_traceidratio": lambda: sampling.ParentBasedTraceIdRatio(settings.ratio),
    }
    return by_name[settings.sampler]()
