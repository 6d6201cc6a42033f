"""Duration settings such as VLLM_SRUN_READY_TIMEOUT: `90s`, `10m`, `1h` (or plain seconds)."""

from __future__ import annotations

import os
import re

from sr.errors import UsageError

READY_TIMEOUT_ENV = "VLLM_SRUN_READY_TIMEOUT"
DEFAULT_READY_TIMEOUT = "10m"
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")


def parse_duration(text: str, *, name: str = "duration") -> float:
    """Seconds from `90s`, `10m`, `1h`, `500ms` or a bare number of seconds; > 0."""
    match = _PATTERN.match(text or "")
    if match is None:
        raise UsageError(f"{name}: expected a duration like 90s, 10m or 1h, got {text!r}")
    seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if seconds <= 0:
        raise UsageError(f"{name}: must be greater than zero, got {text!r}")
    return seconds


def ready_timeout_s(environ: dict[str, str] | None = None) -> float:
    env = os.environ if environ is None else environ
    return parse_duration(env.get(READY_TIMEOUT_ENV, DEFAULT_READY_TIMEOUT), name=READY_TIMEOUT_ENV)
