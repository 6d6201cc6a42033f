"""The runner with learning on: lock, warm-up, exploration, drift stop, mode 2, report."""

import json
import logging

import pytest
import torch
from threads_fakes import CostedForward, FakeClock

from sr.events import RecordingSink
from sr.worker.adaptive import LearningSettings
from sr.worker.threads import ForwardRunner

FAST_AT_2 = {1: 5.0, 2: 3.0}


def make(mode=1, threads=1, budget=2, k=5, **kw):
    clock = FakeClock()
    sink = RecordingSink()
    runner = ForwardRunner(
        threads,
        mode=mode,
        budget=budget,
        clock=clock,
        events=sink,
        settings=LearningSettings(min_samples=k, **kw),
    )
    return runner, clock, sink


def test_nothing_explores_before_the_golden_check():
    runner, clock, _ = make()
    forward = CostedForward(clock, FAST_AT_2)
    for _ in range(10):
        result = runner.run(forward, 100)
        assert forward.produced_at(result) == 1
    assert forward.counts() == [1] * 10
    report = runner.report()
    assert report["status"] == "locked"
    assert report["shadows"] == 0
    assert report["table"] == {}


def test_first_batch_per_bucket_after_unlock_is_an_untimed_warmup_at_the_configured_count():
    runner, clock, _ = make()
    forward = CostedForward(clock, FAST_AT_2)
    runner.unlock()
    runner.run(forward, 100)
    assert forward.counts() == [1]
    report = runner.report()
    assert report["status"] == "warming"
    assert report["table"]["6"]["samples"] == {}
    runner.run(forward, 100)  # now timed, with one shadow
    assert forward.counts() == [1, 1, 2]
    assert runner.report()["status"] == "learning"
    runner.run(forward, 1000)  # a new bucket warms up on its own
    assert forward.counts()[3:] == [1]
    assert runner.report()["table"]["9"]["samples"] == {}


def test_a_bucket_is_learned_after_k_samples_per_count_and_served_answers_stay_configured():
    runner, clock, sink = make(k=5)
    forward = CostedForward(clock, FAST_AT_2)
    runner.unlock()
    runner.run(forward, 100)
    for i in range(5):
        assert runner.report()["table"]["6"]["learned"] is None, i
        result = runner.run(forward, 100)
        assert forward.produced_at(result) == 1
    row = runner.report()["table"]["6"]
    assert row == {
        "tokens": "64-127",
        "batches": 6,
        "learned": 2,
        "median_ms": {"1": 5.0, "2": 3.0},
        "samples": {"1": 5, "2": 5},
        "serving": 1,
    }
    assert runner.report()["suggested_threads"] == 2
    [learned] = sink.named("threads_learned")
    assert learned["learned"] == 2
    assert learned["tokens"] == "64-127"
    # Mode 1: after learning, one run per batch at the configured count.
    before = len(forward.calls)
    result = runner.run(forward, 100)
    assert forward.counts()[before:] == [1]
    assert forward.produced_at(result) == 1


def test_learning_logs_one_json_line_on_sr_events(caplog):
    runner = ForwardRunner(
        1, mode=1, budget=2, clock=FakeClock(), settings=LearningSettings(min_samples=1)
    )
    forward = CostedForward(runner._clock, FAST_AT_2)
    runner.unlock()
    with caplog.at_level(logging.INFO, logger="sr.events"):
        runner.run(forward, 100)
        runner.run(forward, 100)
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "sr.events"]
    assert [line["event"] for line in lines] == ["threads_learned"]
    assert lines[0]["learned"] == 2
    assert lines[0]["median_ms"] == {"1": 5.0, "2": 3.0}


def test_exploration_is_bounded_to_the_first_requests():
    runner, clock, _ = make(k=5, max_shadows=3)
    forward = CostedForward(clock, FAST_AT_2)
    runner.unlock()
    for _ in range(20):
        runner.run(forward, 100)
    assert forward.counts().count(2) == 3
    report = runner.report()
    assert report["status"] == "learned"
    assert report["shadows"] == 3
    assert report["reason"] == "shadow budget of 3 spent; 0 of 1 buckets learned"
    assert report["table"]["6"]["learned"] is None
    assert report["suggested_threads"] is None


def test_drift_stops_learning_for_good_and_says_why(caplog):
    runner, clock, sink = make(k=5)
    forward = CostedForward(clock, FAST_AT_2, drift=lambda threads: threads == 2)
    runner.unlock()
    with caplog.at_level(logging.INFO, logger="sr.events"):
        runner.run(forward, 100)  # warm-up
        result = runner.run(forward, 100)  # shadow at 2 differs by one ulp
    assert forward.produced_at(result) == 1
    report = runner.report()
    assert report["status"] == "stopped"
    assert "2 vs 1 threads gave different bits in bucket 64-127" in report["reason"]
    assert "learning stopped" in report["reason"]
    [stopped] = sink.named("threads_learning_stopped")
    assert stopped["counts"] == [1, 2]
    assert stopped["tokens"] == "64-127"
    before = len(forward.calls)
    for tokens in (100, 5000, 3):
        result = runner.run(forward, tokens)
        assert forward.produced_at(result) == 1
    assert forward.counts()[before:] == [1, 1, 1]
    assert runner.report()["status"] == "stopped"


def test_a_shadow_that_raises_stops_learning_but_the_answer_is_served():
    runner, _, _ = make(k=5)

    def forward():
        if torch.get_num_threads() == 2:
            raise RuntimeError("out of memory at 2 threads")
        return torch.ones(3)

    runner.unlock()
    runner.run(forward, 100)
    assert torch.equal(runner.run(forward, 100), torch.ones(3))
    report = runner.report()
    assert report["status"] == "stopped"
    assert "RuntimeError: out of memory at 2 threads" in report["reason"]


def test_a_served_forward_that_raises_propagates_and_records_nothing():
    runner, clock, _ = make(k=5)
    runner.unlock()
    runner.run(CostedForward(clock, FAST_AT_2), 100)

    def broken():
        raise ValueError("bad batch")

    with pytest.raises(ValueError, match="bad batch"):
        runner.run(broken, 100)
    assert runner.report()["status"] == "warming"
    assert runner.report()["table"]["6"]["batches"] == 1


def learned_mode2(window=3, drift=lambda threads: False):
    runner, clock, sink = make(mode=2, k=2, window=window)
    forward = CostedForward(clock, FAST_AT_2, drift=drift)
    runner.unlock()
    for _ in range(3):  # warm-up + 2 explore steps
        runner.run(forward, 100)
    assert runner.report()["table"]["6"]["learned"] == 2
    return runner, forward, sink


def test_mode2_window_serves_the_learned_count_only_while_it_matches_then_alone():
    runner, forward, _ = learned_mode2(window=3)
    for left in (2, 1, 0):
        before = len(forward.calls)
        result = runner.run(forward, 100)
        assert forward.counts()[before:] == [1, 2]  # configured first, then learned
        assert forward.produced_at(result) == 2
        assert runner.report()["table"]["6"]["window_left"] == left
    for _ in range(3):
        before = len(forward.calls)
        result = runner.run(forward, 100)
        assert forward.counts()[before:] == [2]
        assert forward.produced_at(result) == 2
    assert runner.report()["table"]["6"]["serving"] == 2
    assert runner.report()["status"] == "learning"


def test_mode2_drift_in_the_window_falls_back_to_the_configured_count():
    drifting = {"on": False}
    runner, forward, sink = learned_mode2(
        window=5, drift=lambda threads: drifting["on"] and threads == 2
    )
    runner.run(forward, 100)  # one verified batch
    drifting["on"] = True  # an input the window had not seen drifts at 2 threads
    result = runner.run(forward, 100)
    assert forward.produced_at(result) == 1
    report = runner.report()
    assert report["status"] == "stopped"
    assert "bucket 64-127" in report["reason"]
    assert report["table"]["6"]["serving"] == 1
    assert len(sink.named("threads_learning_stopped")) == 1
    before = len(forward.calls)
    result = runner.run(forward, 100)
    assert forward.counts()[before:] == [1]
    assert forward.produced_at(result) == 1


def test_mode2_with_the_configured_count_learned_serves_it_alone():
    runner, clock, _ = make(mode=2, k=2, window=3)
    forward = CostedForward(clock, {1: 2.0, 2: 4.0})
    runner.unlock()
    for _ in range(3):
        runner.run(forward, 100)
    assert runner.report()["table"]["6"]["learned"] == 1
    before = len(forward.calls)
    runner.run(forward, 100)
    assert forward.counts()[before:] == [1]


def test_report_contents():
    runner, _, _ = make(mode=2, k=2, window=4, threads=2, budget=4)
    assert runner.report() == {
        "mode": 2,
        "status": "locked",
        "reason": "waiting for the golden check",
        "configured_threads": 2,
        "allowed_threads": [1, 2, 4],
        "min_samples": 2,
        "shadows": 0,
        "max_shadows": 2 * 2 * 8,
        "window": 4,
        "suggested_threads": None,
        "table": {},
    }
    json.dumps(runner.report())  # goes into the model card as is
    assert ForwardRunner(3).report() == {"mode": 0, "status": "off", "configured_threads": 3}


def test_mode0_runs_once_at_the_configured_count_and_ignores_unlock():
    clock = FakeClock()
    runner = ForwardRunner(2, clock=clock)
    forward = CostedForward(clock, FAST_AT_2)
    runner.unlock()
    for tokens in (1, 100, 5000):
        runner.run(forward, tokens)
    assert forward.counts() == [2, 2, 2]


def test_the_default_budget_is_this_process_cpu_budget():
    from sr.devices import cpu_budget
    from sr.worker.adaptive import allowed_thread_counts

    runner = ForwardRunner(1, mode=1)
    assert runner.report()["allowed_threads"] == list(allowed_thread_counts(1, cpu_budget()))
