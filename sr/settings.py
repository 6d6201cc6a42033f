"""Process settings: the environment, read and validated once at start-up, handed down.

Rules:
- This module is the one reader of the process environment. `read_process_settings()`
  takes one snapshot of `os.environ` and parses every variable below; a malformed value is a
  UsageError naming the variable, in one line, which an entry point (`sr serve`, `sr worker`,
  `sr inventory`) reports with exit status 2 before anything starts.
- Entry points read the settings once and pass them down (serve -> open_router ->
  Supervisor -> ReplicaRunner). Library calls made without settings (the Python API, a
  model resolved in a test) read them at that call, through this module.
- The snapshot (`Settings.environ`) is what children are started with (managed workers, the
  fork server: sr.pool.fork_start.worker_env), and where the variables that a config names
  (`api_key_env`) and that sr passes on untouched (GPU visibility masks) are looked up.
  A reload takes a new snapshot: that is how a rotated worker key is adopted.
- Only `replace_process_environment`, `default_process_variables` and `flag_variables` write
  `os.environ`: a forked worker adopting its request's environment, defaults that native
  libraries read themselves (oneDNN's cache sizes), and variables a flag stands for
  (`sr serve --otlp-endpoint`), so that a reload's new snapshot keeps them.

The variables (docs/config.md, docs/threads.md, docs/security.md, docs/models.md say more):

  SR_LOG_FORMAT                   text | json: log lines on stderr when no --log-format
  SR_FAULT_INJECTION              1: the fault-injection routes (router and workers) are on
  SR_WORKER_API_KEY               the key a TCP worker requires (`sr worker`; else --api-key)
  SR_API_KEY                      the bearer key `sr inventory` sends (else --api-key)
  SR_GPU_INVENTORY                the GPUs to place on, e.g. `cuda:0,cuda:1` (sr.devices);
                                  overrides probing /dev and the visibility masks
  SR_MODEL_DIR                    a folder of model folders, `org/name` or `org--name`
  SR_MALLOC                       default: leave glibc malloc untuned (sr.worker.allocator)
  SR_WORKER_START                 fork | spawn: how CPU workers start (sr.pool.fork_start)
  SR_CACHE_DIR                    where what a start measures of its host is kept: the kernel
                                  probe, cut-offs, workers' start checks, ONNX exports (`off`:
                                  not kept; default $XDG_CACHE_HOME/sr or ~/.cache/sr)
  VLLM_SRUN_CPU_THREADS           threads per managed CPU worker (capped at the CPU budget)
  VLLM_SRUN_CPU_ADAPTIVE_THREADS  0 | 1 | 2: workers' adaptive thread counts (sr.thread_budget)
  VLLM_SRUN_RESULT_CACHE          router result cache entries per deployment; 0: off
  VLLM_SRUN_READY_TIMEOUT         how long startup waits for ready workers (90s, 10m, 1h)
  HF_HUB_CACHE, HF_HOME           where the Hugging Face hub cache is (sr.models.artifacts)
  HF_ENDPOINT, HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE   Hub downloads (sr.models.download)
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT   traces on, sent there
                                  (`sr serve --otlp-endpoint` sets the first; sr.traces)
  OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG, OTEL_SDK_DISABLED
                                  the traces' service name and sampler (sr.traces)
Passed on to workers and read there by the libraries themselves: HF_TOKEN, GOMP_SPINCOUNT
(sr sets 20000 unless given, 1000 with adaptive threads: sr.pool.fork_start), OMP_PROC_BIND and
OMP_PLACES (OpenMP then binds the threads, and sr.worker.placement steps aside),
CUDA_VISIBLE_DEVICES and the ROCm masks, ONEDNN_PRIMITIVE_CACHE_CAPACITY and
LRU_CACHE_CAPACITY (sr.models.kernels).
"""

from __future__ import annotations

import os
import re
import types
from collections.abc import Mapping
from pathlib import Path

import attrs

from sr.errors import UsageError
from sr.logs import resolve_log_format
from sr.thread_budget import adaptive_mode, thread_override
from sr.traces import TraceSettings

MODEL_DIR_ENV = "SR_MODEL_DIR"
INVENTORY_API_KEY_ENV = "SR_API_KEY"
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
_TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's own reading of a boolean variable
READY_TIMEOUT_ENV = "VLLM_SRUN_READY_TIMEOUT"
DEFAULT_READY_TIMEOUT = "10m"
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
RESULT_CACHE_ENV = "VLLM_SRUN_RESULT_CACHE"
DEFAULT_RESULT_CACHE_ENTRIES = 4096
FAULT_INJECTION_ENV = "SR_FAULT_INJECTION"


def parse_duration(text: str, *, name: str = "duration") -> float:
    """Seconds from `90s`, `10m`, `1h`, `500ms` or a bare number of seconds; > 0."""
    match = _DURATION.match(text or "")
    if match is None:
        raise UsageError(f"{name}: expected a duration like 90s, 10m or 1h, got {text!r}")
    seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if seconds <= 0:
        raise UsageError(f"{name}: must be greater than zero, got {text!r}")
    return seconds


def result_cache_entries_from_env(environ: Mapping[str, str]) -> int:
    """Entries per deployment of the router's result cache (sr.router.cache); 0 turns it off."""
    raw = environ.get(RESULT_CACHE_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_RESULT_CACHE_ENTRIES
    text = raw.strip()
    if not text.isdigit():  # a usage error: `sr serve` exits 2 before starting anything
        raise UsageError(f"{RESULT_CACHE_ENV} must be a non-negative integer, got {raw!r}")
    return int(text)


def fault_injection_enabled(environ: Mapping[str, str]) -> bool:
    """The fault-injection routes (sr.router.faults, sr.worker.faults) are on: exactly `1`."""
    return environ.get(FAULT_INJECTION_ENV) == "1"


@attrs.frozen
class ModelSources:
    """Where models are found (sr.models.artifacts) and fetched from (sr.models.download)."""

    model_dir: str | None = None  # SR_MODEL_DIR
    hub_cache: Path = attrs.field(factory=lambda: Path.home() / ".cache" / "huggingface" / "hub")
    hf_endpoint: str | None = None  # HF_ENDPOINT, without a trailing slash
    offline_variable: str | None = None  # the variable that turned Hub access off, if any

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> ModelSources:
        if env.get("HF_HUB_CACHE"):
            hub_cache = Path(env["HF_HUB_CACHE"]).expanduser()
        elif env.get("HF_HOME"):
            hub_cache = Path(env["HF_HOME"]).expanduser() / "hub"
        else:
            hub_cache = Path.home() / ".cache" / "huggingface" / "hub"
        offline = next(
            (name for name in OFFLINE_VARIABLES if (env.get(name) or "").strip().upper() in _TRUE),
            None,
        )
        return cls(
            model_dir=env.get(MODEL_DIR_ENV) or None,
            hub_cache=hub_cache,
            hf_endpoint=(env.get("HF_ENDPOINT") or "").strip().rstrip("/") or None,
            offline_variable=offline,
        )


@attrs.frozen
class Settings:
    """Everything sr takes from its environment, parsed (module docstring)."""

    environ: Mapping[str, str] = attrs.field(repr=False)  # the snapshot (keys: never shown)
    ready_timeout_s: float
    result_cache_entries: int
    worker_threads: int | None  # VLLM_SRUN_CPU_THREADS, before the cap at the CPU budget
    adaptive_threads: int
    fault_injection: bool
    inventory_api_key: str | None = attrs.field(repr=False)
    models: ModelSources
    traces: TraceSettings | None = None  # None: traces off (sr.traces)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Settings:
        """Parse and validate `environ` (copied); UsageError names a malformed variable."""
        env = types.MappingProxyType(dict(environ))
        resolve_log_format(None, env, _NOT_A_TERMINAL)  # a bad SR_LOG_FORMAT fails here
        return cls(
            environ=env,
            ready_timeout_s=parse_duration(
                env.get(READY_TIMEOUT_ENV, DEFAULT_READY_TIMEOUT), name=READY_TIMEOUT_ENV
            ),
            result_cache_entries=result_cache_entries_from_env(env),
            worker_threads=thread_override(env),
            adaptive_threads=adaptive_mode(env),
            fault_injection=fault_injection_enabled(env),
            inventory_api_key=env.get(INVENTORY_API_KEY_ENV),
            models=ModelSources.from_environ(env),
            traces=TraceSettings.from_environ(env),
        )


class _NotATerminal:
    def isatty(self) -> bool:
        return False


_NOT_A_TERMINAL = _NotATerminal()


CACHE_DIR_ENV = "SR_CACHE_DIR"
CACHE_OFF = "off"
# Variables the native libraries under torch read themselves (threading, oneDNN's and MKL's
# code paths): what a kernel probe found holds only under the same values.
_NATIVE_PREFIXES = ("DNNL_", "ONEDNN_", "MKL_", "OMP_", "KMP_", "GOMP_", "ATEN_")


def host_cache_dir(env: Mapping[str, str] | None = None) -> Path | None:
    """Where sr keeps what it measured about its host (sr.models.probe_cache):
    SR_CACHE_DIR (`off`: nowhere), else $XDG_CACHE_HOME/sr, else ~/.cache/sr. `env`:
    default this process's environment, now."""
    env = os.environ if env is None else env
    explicit = env.get(CACHE_DIR_ENV)
    if explicit == CACHE_OFF:
        return None
    if explicit:
        return Path(explicit)
    xdg = env.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path(env.get("HOME") or Path.home()) / ".cache") / "sr"


def native_library_variables(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of `env` (default this process's) that torch's native libraries read."""
    env = os.environ if env is None else env
    return {name: value for name, value in env.items() if name.startswith(_NATIVE_PREFIXES)}


def read_process_settings() -> Settings:
    """The settings of this process's environment, now (module docstring)."""
    return Settings.from_environ(os.environ)


def replace_process_environment(env: Mapping[str, str]) -> None:
    """A forked worker's environment becomes its request's (sr.pool.forkserver)."""
    os.environ.clear()
    os.environ.update(env)


def default_process_variables(defaults: Mapping[str, str]) -> None:
    """Set variables that native libraries read themselves, unless the operator did."""
    for name, value in defaults.items():
        os.environ.setdefault(name, value)


def flag_variables(values: Mapping[str, str]) -> None:
    """Variables a command-line flag stands for, over the environment's own: every later
    snapshot (a reload's, the workers') has them."""
    os.environ.update(values)
