"""What one worker process is asked to serve: the `sr worker` flags as an attrs class.

`WorkerOptions` is the deployment's `EngineArgs` (sr.config.engine, whose fields are the
engine flags) plus where the worker runs and with how many threads. `validate` applies the
rules the config applies too (sr.config.validate), in the worker's words (flag names): an
attached worker's operator starts it by hand.
"""

from __future__ import annotations

import attrs

from sr.config.engine import (
    DEPLOYMENT_DTYPES,
    ENGINES,
    FLOAT16_REFUSED_ON,
    KERNELS,
    MIN_MAX_TOKENS,
    OVERFLOW_MODES,
    PROFILES,
    EngineArgs,
    onnx_engine_problem,
)
from sr.config.validate import device_error
from sr.errors import UsageError
from sr.traces import TraceSettings


@attrs.frozen
class WorkerOptions(EngineArgs):
    # dtype, as asked; the service resolves what is served. kernel auto: the host's probe
    # picks (sr.models.linear).
    device: str = "cpu"
    threads: int = 1
    fault_injection: bool = False
    # Where this worker's spans go (sr.traces, from its environment), None: traces off.
    traces: TraceSettings | None = None

    @classmethod
    def serving(
        cls, engine: EngineArgs, *, device: str, threads: int, fault_injection: bool = False
    ) -> WorkerOptions:
        return cls(
            **attrs.asdict(engine), device=device, threads=threads, fault_injection=fault_injection
        )

    @property
    def engine_args(self) -> EngineArgs:
        return EngineArgs(**{f.name: getattr(self, f.name) for f in attrs.fields(EngineArgs)})

    def validate(self) -> None:
        """Raise UsageError (one line, naming the flag) for options no worker can serve."""
        if not self.artifact:
            raise UsageError("--artifact: must not be empty")
        if self.threads < 1:
            raise UsageError(f"--threads: must be >= 1, got {self.threads}")
        if self.profile not in PROFILES:
            raise UsageError(f"--profile: unknown profile {self.profile!r}; one of {PROFILES}")
        if self.max_tokens is not None and self.max_tokens < MIN_MAX_TOKENS:
            raise UsageError(f"--max-tokens: must be >= {MIN_MAX_TOKENS}, got {self.max_tokens}")
        if self.overflow not in OVERFLOW_MODES:
            raise UsageError(f"--overflow: must be one of {OVERFLOW_MODES}, got {self.overflow!r}")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise UsageError(f"--max-num-seqs: must be >= 1, got {self.max_num_seqs}")
        budget = self.max_num_batched_tokens
        if budget is not None and self.max_tokens is not None and budget < self.max_tokens:
            # A row of max_tokens must fit in one forward, or it could never run.
            raise UsageError(
                f"--max-num-batched-tokens: must be >= --max-tokens ({self.max_tokens}), "
                f"got {budget}"
            )
        if problem := device_error(self.device):
            raise UsageError(f"--device: {problem}")
        if self.kernel not in KERNELS:
            raise UsageError(f"--kernel: must be one of {', '.join(KERNELS)}, got {self.kernel!r}")
        # `--dtype`: a precision, or `auto` for the profile's choice on this host
        # (sr.config.precision); the pool leaves the default (auto) out of the argv.
        if self.dtype not in DEPLOYMENT_DTYPES:
            raise UsageError(
                f"--dtype: must be one of {', '.join(DEPLOYMENT_DTYPES)}, got {self.dtype!r}"
            )
        if self.dtype == "float16" and self.device in FLOAT16_REFUSED_ON:
            # Measured: float16 matmul on this torch CPU build is ~5x slower than float32
            # (no native kernel), bfloat16 ~2x faster (docs/decisions.md).
            raise UsageError(
                f"--dtype: float16 is not served on {self.device} (CPU float16 matmul is"
                " several times slower than float32); use bfloat16 or float32"
            )
        if self.engine not in ENGINES:
            raise UsageError(f"--engine: must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if problem := onnx_engine_problem(self.engine, self.dtype, self.kernel, [self.device]):
            raise UsageError(f"--engine: {problem}")
