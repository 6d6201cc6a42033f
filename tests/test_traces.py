"""sr.traces: the trace settings read from the environment, OpenTelemetry's variables as
its SDKs read them, and the SDK kept out of processes that did not ask for traces."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sr.errors import UsageError
from sr.traces import TraceSettings, traceparent_of, traces_url


def test_off_without_an_endpoint_or_when_the_sdk_is_disabled():
    assert TraceSettings.from_environ({}) is None
    assert TraceSettings.from_environ({"OTEL_SERVICE_NAME": "x"}) is None
    disabled = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}
    assert TraceSettings.from_environ(disabled) is None


def test_endpoints_as_the_sdks_read_them():
    base = TraceSettings.from_environ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"})
    assert base == TraceSettings(endpoint="http://c:4318/v1/traces")
    # the signal's own variable is the whole URL, and wins over the base
    whole = TraceSettings.from_environ({
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://t:443/custom",
    })  # fmt: skip
    assert whole is not None and whole.endpoint == "https://t:443/custom"
    assert traces_url("http://c:4318/v1/traces/") == "http://c:4318/v1/traces"


def test_service_name_and_sampler():
    settings = TraceSettings.from_environ({
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
        "OTEL_SERVICE_NAME": "embedder",
        "OTEL_TRACES_SAMPLER": "ParentBased_TraceIdRatio",
        "OTEL_TRACES_SAMPLER_ARG": "0.25",
    })  # fmt: skip
    assert settings == TraceSettings(
        endpoint="http://c:4318/v1/traces", service_name="embedder",
        sampler="parentbased_traceidratio", ratio=0.25,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "c:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT: expected"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "grpc://c"}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        ({"OTEL_TRACES_SAMPLER": "often"}, "OTEL_TRACES_SAMPLER: must be one of"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"},
         "OTEL_TRACES_SAMPLER_ARG: must be a number from 0 to 1, got '2'"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"},
         "OTEL_TRACES_SAMPLER_ARG: must be a number from 0 to 1, got 'half'"),
    ],
)  # fmt: skip
def test_malformed_variables_are_named(env, message):
    with pytest.raises(UsageError, match=message):
        TraceSettings.from_environ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", **env})


def test_traceparent_is_w3c_and_round_trips():
    """Checked against the SDK's own W3C propagator, not against sr."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    span = TracerProvider().get_tracer("t").start_span("s")
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, trace.set_span_in_context(span))
    assert traceparent_of(span) == carrier["traceparent"]


def test_the_request_path_never_imports_opentelemetry_when_traces_are_off():
    """The router's modules, the pool's and the settings' load without the SDK or the API."""
    code = (
        "import sys, sr.router.serve, sr.router.app, sr.pool.supervisor, sr.settings, "
        "sr.worker.http;"
        "sr.settings.read_process_settings();"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert out.strip() == "[]"


def test_a_full_queue_logs_one_drop_then_mutes_the_processors_logger():
    """The SDK warns on every dropped span; sr logs the first and mutes the logger (no
    record is even made) for a minute."""
    import logging

    from sr.traces import _BATCH_PROCESSOR_LOGGER, _quiet_drops

    logger = logging.getLogger(_BATCH_PROCESSOR_LOGGER)
    # Another test in this process may have opened a tracer already: start from a bare
    # logger and put back what was there.
    saved_filters, saved_level = list(logger.filters), logger.level
    logger.filters.clear()
    logger.setLevel(logging.NOTSET)
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    _quiet_drops()
    _quiet_drops()  # once per logger, however many tracers a process opens
    try:
        assert len(logger.filters) == 1
        logger.addHandler(handler)
        logger.warning("Queue full, dropping %s.", "Span")
        logger.warning("Queue full, dropping %s.", "Span")
        assert seen == ["Queue full, dropping Span."]
        assert not logger.isEnabledFor(logging.WARNING)
    finally:
        logger.removeHandler(handler)
        logger.filters[:] = saved_filters
        logger.setLevel(saved_level)
