"""Thread budgets from the environment, without importing torch.

sr.settings parses the variables with these functions, once per process, so that the router
sizes its workers and refuses bad settings before any worker starts, and the worker applies
the same rules. Keeping them torch-free keeps torch out of the router process.
"""

from __future__ import annotations

from collections.abc import Mapping

from sr.errors import UsageError

__all__ = [
    "ADAPTIVE_ENV",
    "THREADS_ENV",
    "adaptive_mode",
    "capped_thread_count",
    "thread_override",
]

THREADS_ENV = "VLLM_SRUN_CPU_THREADS"
ADAPTIVE_ENV = "VLLM_SRUN_CPU_ADAPTIVE_THREADS"
MAX_DEFAULT_THREADS = 16


def capped_thread_count(budget: int, override: int | None) -> int:
    """Threads for one managed CPU worker: half the budget (1..16), or `override`
    (VLLM_SRUN_CPU_THREADS) capped at the budget."""
    if budget < 1:
        raise ValueError(f"CPU budget must be >= 1, got {budget}")
    if override is None:
        return max(1, min(MAX_DEFAULT_THREADS, budget // 2))
    return min(override, budget)


def thread_override(env: Mapping[str, str]) -> int | None:
    """VLLM_SRUN_CPU_THREADS as a positive integer, or None when unset."""
    raw = env.get(THREADS_ENV)
    if raw is None:
        return None
    text = raw.strip()
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise UsageError(f"{THREADS_ENV} must be a positive integer, got {raw!r}")
    return int(text)


def adaptive_mode(env: Mapping[str, str]) -> int:
    """0 (off, also when unset), 1 (learn and report) or 2 (learned counts may serve)."""
    raw = env.get(ADAPTIVE_ENV)
    if raw is None:
        return 0
    text = raw.strip()
    if text not in ("0", "1", "2"):
        raise UsageError(f"{ADAPTIVE_ENV} must be 0, 1 or 2, got {raw!r}")
    return int(text)
