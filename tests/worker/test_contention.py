"""Yielding cores (sr.worker.contention): the pure policy, the sampling, the start-up probe
and the runner serving at the yielded count."""

from __future__ import annotations

import pytest
import torch

from sr.worker import contention
from sr.worker.contention import (
    SAMPLE_S,
    CoreYield,
    CpuSample,
    YieldPolicy,
    host_busy_seconds,
    host_cpu_unreadable,
)
from sr.worker.threads import ForwardRunner
from sr.worker.warmup import thread_count_probe, yield_counts


def observe(policy: YieldPolicy, seconds: float, others_cores: float, own_cores: float = 0):
    """A sample `seconds` after the policy's last one, with that much work besides ours."""
    last = policy._last or CpuSample(0.0, 0.0, 0.0)
    sample = CpuSample(
        last.wall_s + seconds,
        last.host_busy_s + (others_cores + own_cores) * seconds,
        last.own_cpu_s + own_cores * seconds,
    )
    return policy.observe(sample)


def test_the_first_sample_serves_the_configured_count():
    policy = YieldPolicy(2, [1], cpus=2)
    assert policy.observe(CpuSample(10.0, 500.0, 3.0)) == 2


@pytest.mark.parametrize(
    ("others", "expected"),
    [(0.0, 2), (0.3, 2), (0.49, 2), (0.51, 1), (1.0, 1), (1.9, 1), (5.0, 1)],
)
def test_two_threads_on_two_cores_yield_to_more_than_half_a_core_of_other_work(others, expected):
    policy = YieldPolicy(2, [1], cpus=2)
    observe(policy, 1.0, 0.0)
    assert observe(policy, 0.2, others) == expected


def test_this_processs_own_work_is_not_other_work():
    policy = YieldPolicy(2, [1], cpus=2)
    observe(policy, 1.0, 0.0)
    assert observe(policy, 0.2, others_cores=0.0, own_cores=2.0) == 2


def test_the_largest_checked_count_that_fits_serves():
    policy = YieldPolicy(8, [4, 2, 1], cpus=8)
    observe(policy, 1.0, 0.0)
    assert observe(policy, 0.1, 3.2) == 4  # room for floor(8 - 3.2 + 0.5) = 5
    assert observe(policy, 0.1, 5.0) == 2  # room 3: 2 is the largest count checked
    assert observe(policy, 0.1, 7.9) == 1  # room 0: the smallest count
    assert observe(policy, 0.1, 0.2) == 8


def test_between_samples_the_choice_holds():
    policy = YieldPolicy(2, [1], cpus=2)
    observe(policy, 1.0, 0.0)
    assert observe(policy, SAMPLE_S, 2.0) == 1
    assert not policy.due(policy._last.wall_s + SAMPLE_S / 2)
    assert observe(policy, SAMPLE_S / 2, 0.0) == 1  # too soon: 10 ms ticks would be noise
    assert policy.due(policy._last.wall_s + SAMPLE_S)


def test_core_yield_samples_only_when_due_and_counts_yielded_forwards():
    now = [100.0]
    busy = [0.0]
    reads = []

    def read_busy() -> float:
        reads.append(now[0])
        return busy[0]

    core_yield = CoreYield(YieldPolicy(2, [1], cpus=2), read_busy, clock=lambda: now[0])
    assert core_yield.threads() == 2
    now[0] += 0.01
    assert core_yield.threads() == 2
    assert reads == [100.0]  # not due: no read
    now[0] += 1.0
    busy[0] += 2.0  # two cores of someone else's work for a second (the test's CPU is ours)
    assert core_yield.threads() == 1
    assert core_yield.threads() == 1
    assert core_yield.card() == {"counts": [1, 2], "serving": 1, "yielded_forwards": 2}


def test_host_busy_time_counts_only_the_cpus_given(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  300 10 60 900 5 1 2 3 40 0\n"
        "cpu0 100 0 20 500 1 0 1 1 0 0\n"
        "cpu1 200 10 40 400 4 1 1 2 40 0\n"
        "intr 12345\ncpu9 999 0 0 0 0 0 0 0 0 0\n"
    )
    tick = contention._TICK_S  # user + nice + system + irq + softirq + steal, in ticks:
    assert host_busy_seconds(frozenset({0}), str(stat)) == pytest.approx(122 * tick)
    assert host_busy_seconds(frozenset({1}), str(stat)) == pytest.approx(254 * tick)
    assert host_busy_seconds(frozenset({0, 1}), str(stat)) == pytest.approx(376 * tick)
    assert host_cpu_unreadable(frozenset({0}), str(stat)) is None
    assert "no busy time" in host_cpu_unreadable(frozenset({7}), str(stat))
    assert "FileNotFoundError" in host_cpu_unreadable(frozenset({0}), str(tmp_path / "none"))


def test_yield_counts_are_the_halvings():
    assert yield_counts(1) == []
    assert yield_counts(2) == [1]
    assert yield_counts(3) == [1]
    assert yield_counts(8) == [4, 2, 1]


class ThreadSensitive:
    """A model whose answers depend on the thread count, unless told otherwise."""

    head_labels = None

    def __init__(self, sensitive: bool):
        self.sensitive = sensitive

    def tokenize(self, texts):
        return [[1] * (len(text) % 7 + 1) for text in texts]

    def truncate(self, ids, limit):
        return ids[:limit]

    def embed(self, rows):
        value = float(torch.get_num_threads()) if self.sensitive else 1.0
        return torch.full((len(rows), 4), value)


@pytest.mark.parametrize("sensitive", [False, True])
def test_the_probe_allows_only_counts_with_the_configured_bits(sensitive):
    from sr.worker.threads import THREADS

    before = torch.get_num_threads()
    try:
        counts, detail = thread_count_probe(ThreadSensitive(sensitive), 2, THREADS.use, 64)
    finally:
        torch.set_num_threads(before)
    if sensitive:
        assert counts == [] and "not at [1]" in detail
    else:
        assert counts == [1] and "bit-identical to 2 threads at [1]" in detail


def test_the_runner_serves_at_the_yielded_count():
    now, busy = [100.0], [0.0]
    core_yield = CoreYield(YieldPolicy(2, [1], cpus=2), lambda: busy[0], clock=lambda: now[0])
    runner = ForwardRunner(2)
    runner.allow_yielding(core_yield)
    before = torch.get_num_threads()
    try:
        assert runner.run(torch.get_num_threads, 10) == 2  # the first sample
        now[0] += 1.0
        busy[0] += 2.0  # two cores of other work for a second
        assert runner.run(torch.get_num_threads, 10) == 1
        now[0] += 1.0  # a quiet second
        assert runner.run(torch.get_num_threads, 10) == 2
    finally:
        torch.set_num_threads(before)
    assert core_yield.yielded == 1


def test_yielding_is_refused_to_a_learning_runner():
    with pytest.raises(ValueError, match="mode 0"):
        ForwardRunner(2, mode=1, budget=2).allow_yielding(
            CoreYield(YieldPolicy(2, [1], cpus=2), lambda: 0.0)
        )


@pytest.mark.parametrize("threads", [1, 2])
async def test_the_card_says_whether_the_worker_yields_and_why(tiny_model_dir, threads):
    """A real worker: at 2 threads the probe decides (tiny BERT on BLAS: MKL's bits may or
    may not move with the count on a host), at 1 there is nothing to yield."""
    from worker_fakes import card_entry

    card = await card_entry(tiny_model_dir, threads, "cpu_yield")
    if threads == 1:
        assert card == {"enabled": False, "reason": "1 thread configured"}
    elif card["enabled"]:
        assert card["counts"] == [1, 2] and card["serving"] == 2
        assert "bit-identical to 2 threads at [1]" in card["reason"]
    else:
        assert "not at [1]" in card["reason"]


def test_workers_spin_20000_times_unless_learning_or_the_operator_says_otherwise():
    from sr.pool.fork_start import worker_env

    assert worker_env({})["GOMP_SPINCOUNT"] == "20000"
    assert worker_env({"VLLM_SRUN_CPU_ADAPTIVE_THREADS": "0"})["GOMP_SPINCOUNT"] == "20000"
    for mode in ("1", "2"):  # a learner chooses the counts and nothing yields
        assert worker_env({"VLLM_SRUN_CPU_ADAPTIVE_THREADS": mode})["GOMP_SPINCOUNT"] == "1000"
    assert worker_env({"GOMP_SPINCOUNT": "300000"})["GOMP_SPINCOUNT"] == "300000"


async def test_a_worker_beside_a_busy_process_yields(tiny_model_dir):
    """The whole path on this host: /proc/stat, the worker's own CPU time, the runner. One
    busy-looping process (bounded) holds a core; the worker at as many threads as CPUs
    must see no room for all of them within a few forwards."""
    import json
    import subprocess
    import sys

    import trio
    from worker_fakes import passing_golden, running

    from sr.worker.contention import usable_cpus
    from sr.worker.options import WorkerOptions

    threads = len(usable_cpus())
    if threads < 2:
        pytest.skip("one usable CPU: nothing to yield")
    before = torch.get_num_threads()
    hog = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 20\n"
                            "while time.time() < end: pass"])  # fmt: skip
    try:
        opts = WorkerOptions(artifact=str(tiny_model_dir), threads=threads)
        async with running(opts, golden_check_fn=passing_golden) as service:
            if not service.card()["cpu_yield"]["enabled"]:
                pytest.skip(f"no yielding here: {service.card()['cpu_yield']['reason']}")
            with trio.fail_after(15):
                sent = 0
                while service.card()["cpu_yield"]["yielded_forwards"] == 0:
                    sent += 1  # a new text each time: the worker's result cache answers repeats
                    body = json.dumps({"input": [f"text number {sent} to embed"]}).encode()
                    status, _, _ = await service.handle("POST", "/v1/embeddings", body)
                    assert status == 200
                    await trio.sleep(0.02)
    finally:
        hog.kill()
        hog.wait()
        torch.set_num_threads(before)
