import pytest

from sr.errors import UsageError
from sr.thread_budget import adaptive_mode, capped_thread_count, thread_override


def worker_thread_count(budget: int, env: dict[str, str]) -> int:
    """What the router gives a managed CPU worker (sr.pool.supervisor.default_worker_threads)."""
    return capped_thread_count(budget, thread_override(env))


@pytest.mark.parametrize(
    ("budget", "expected"),
    [(1, 1), (2, 1), (3, 1), (4, 2), (7, 3), (16, 8), (32, 16), (33, 16), (128, 16)],
)
def test_default_is_half_the_budget_between_1_and_16(budget, expected):
    assert worker_thread_count(budget, {}) == expected


@pytest.mark.parametrize(
    ("value", "budget", "expected"),
    [("1", 2, 1), ("2", 2, 2), ("8", 2, 2), ("24", 64, 24), (" 3 ", 4, 3), ("64", 64, 64)],
)
def test_override_is_capped_at_the_budget_not_at_16(value, budget, expected):
    assert worker_thread_count(budget, {"VLLM_SRUN_CPU_THREADS": value}) == expected


@pytest.mark.parametrize("value", ["0", "-1", "abc", "1.5", "", " ", "+2", "0x4", "²", "1e2"])
def test_bad_override_is_a_usage_error_naming_the_variable(value):
    with pytest.raises(UsageError) as info:
        worker_thread_count(4, {"VLLM_SRUN_CPU_THREADS": value})
    message = str(info.value)
    assert "VLLM_SRUN_CPU_THREADS" in message
    assert repr(value) in message
    assert "\n" not in message


def test_budget_below_one_is_a_programming_error():
    with pytest.raises(ValueError):
        worker_thread_count(0, {})


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, 0),
        ({"VLLM_SRUN_CPU_ADAPTIVE_THREADS": "0"}, 0),
        ({"VLLM_SRUN_CPU_ADAPTIVE_THREADS": "1"}, 1),
        ({"VLLM_SRUN_CPU_ADAPTIVE_THREADS": "2"}, 2),
        ({"VLLM_SRUN_CPU_ADAPTIVE_THREADS": " 2\n"}, 2),
    ],
)
def test_adaptive_mode(env, expected):
    assert adaptive_mode(env) == expected


@pytest.mark.parametrize("value", ["3", "-1", "", "yes", "true", "1.0"])
def test_bad_adaptive_mode_is_a_usage_error(value):
    with pytest.raises(UsageError, match="VLLM_SRUN_CPU_ADAPTIVE_THREADS must be 0, 1 or 2"):
        adaptive_mode({"VLLM_SRUN_CPU_ADAPTIVE_THREADS": value})
