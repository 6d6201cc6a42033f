"""What one worker process is asked to serve: the `sr worker` flags as an attrs class."""

from __future__ import annotations

import attrs

from sr.config.precision import AUTO_DTYPE
from sr.config.schema import (
    DEFAULT_DTYPE,
    DEFAULT_KERNEL,
    DTYPES,
    FLOAT16_REFUSED_ON,
    KERNELS,
    PROFILES,
)
from sr.errors import UsageError

OVERFLOW_MODES = ("reject", "truncate")
# `--dtype`: a precision, or `auto` for the profile's choice on this host
# (sr.config.precision: float32 under exact; bfloat16 where native under throughput).
# The default is the deployment's (DEFAULT_DTYPE): the pool leaves it out of the argv.
WORKER_DTYPES = (AUTO_DTYPE, *DTYPES)


@attrs.define
class WorkerOptions:
    artifact: str
    device: str = "cpu"
    revision: str | None = None
    threads: int = 1
    profile: str = "exact"
    max_tokens: int = 256
    overflow: str = "reject"
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    dtype: str = DEFAULT_DTYPE  # as asked; the service resolves what is served
    kernel: str = DEFAULT_KERNEL  # auto: the host's probe picks (sr.models.linear)
    fault_injection: bool = False

    def validate(self) -> None:
        """Raise UsageError (one line, naming the flag) for options no worker can serve."""
        if not self.artifact:
            raise UsageError("--artifact: must not be empty")
        if self.threads < 1:
            raise UsageError(f"--threads: must be >= 1, got {self.threads}")
        if self.profile not in PROFILES:
            raise UsageError(f"--profile: unknown profile {self.profile!r}; one of {PROFILES}")
        if self.max_tokens < 2:
            raise UsageError(f"--max-tokens: must be >= 2, got {self.max_tokens}")
        if self.overflow not in OVERFLOW_MODES:
            raise UsageError(f"--overflow: must be one of {OVERFLOW_MODES}, got {self.overflow!r}")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise UsageError(f"--max-num-seqs: must be >= 1, got {self.max_num_seqs}")
        budget = self.max_num_batched_tokens
        if budget is not None and budget < self.max_tokens:
            # A row of max_tokens must fit in one forward, or it could never run.
            raise UsageError(
                f"--max-num-batched-tokens: must be >= --max-tokens ({self.max_tokens}), "
                f"got {budget}"
            )
        if not _is_device(self.device):
            raise UsageError(f"--device: expected cpu, cuda:N or rocm:N, got {self.device!r}")
        if self.kernel not in KERNELS:
            raise UsageError(f"--kernel: must be one of {', '.join(KERNELS)}, got {self.kernel!r}")
        if self.dtype not in WORKER_DTYPES:
            raise UsageError(
                f"--dtype: must be one of {', '.join(WORKER_DTYPES)}, got {self.dtype!r}"
            )
        if self.dtype == "float16" and self.device in FLOAT16_REFUSED_ON:
            # Measured: float16 matmul on this torch CPU build is ~5x slower than float32
            # (no native kernel), bfloat16 ~2x faster (docs/decisions.md).
            raise UsageError(
                f"--dtype: float16 is not served on {self.device} (CPU float16 matmul is"
                " several times slower than float32); use bfloat16 or float32"
            )


def _is_device(device: str) -> bool:
    if device == "cpu":
        return True
    kind, _, index = device.partition(":")
    return kind in ("cuda", "rocm") and index.isdigit()
