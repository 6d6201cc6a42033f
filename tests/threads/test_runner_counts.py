"""ForwardRunner.at_each_count: per-count caches are filled before any timing."""

from __future__ import annotations

import torch

from sr.worker.threads import ForwardRunner, ThreadContext


def test_at_each_count_runs_once_per_allowed_count_untimed():
    context = ThreadContext()
    seen: list[int] = []
    runner = ForwardRunner(1, mode=1, budget=4, context=context)
    runner.at_each_count(lambda: seen.append(torch.get_num_threads()))
    assert seen == list(runner.thread_counts)
    assert sorted(seen) == [1, 2, 4]
    assert runner.report()["status"] == "locked"  # nothing was recorded as learning


def test_at_each_count_without_learning_is_the_configured_count():
    seen: list[int] = []
    runner = ForwardRunner(2, context=ThreadContext())
    runner.at_each_count(lambda: seen.append(torch.get_num_threads()))
    assert seen == [2]
