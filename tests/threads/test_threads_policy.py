import pytest

from sr.worker.adaptive import (
    LearningSettings,
    Outcome,
    ThreadLearner,
    allowed_thread_counts,
    bucket_label,
    size_bucket,
)


@pytest.mark.parametrize(
    ("configured", "budget", "expected"),
    [
        (1, 1, (1,)),
        (1, 2, (1, 2)),
        (2, 2, (1, 2)),
        (2, 4, (1, 2, 4)),
        (3, 8, (1, 2, 3, 4, 8)),
        (8, 16, (1, 2, 4, 8, 16)),
        (6, 64, (1, 2, 4, 6, 8, 16)),
        (32, 64, (1, 2, 4, 8, 16, 32)),
    ],
)
def test_allowed_counts_are_powers_of_two_up_to_the_budget_plus_the_configured(
    configured, budget, expected
):
    assert allowed_thread_counts(configured, budget) == expected


@pytest.mark.parametrize(
    ("tokens", "bucket", "label"),
    [
        (0, 0, "1-1"),
        (1, 0, "1-1"),
        (2, 1, "2-3"),
        (3, 1, "2-3"),
        (64, 6, "64-127"),
        (127, 6, "64-127"),
        (128, 7, "128-255"),
        (8192, 13, "8192-16383"),
    ],
)
def test_buckets_are_log2_of_padded_tokens(tokens, bucket, label):
    assert size_bucket(tokens) == bucket
    assert bucket_label(size_bucket(tokens)) == label


def learner(mode=1, k=2, configured=1, allowed=(1, 2), **kw):
    return ThreadLearner(
        configured, allowed, mode=mode, settings=LearningSettings(min_samples=k, **kw)
    )


def explore(lrn, tokens, served_ms, shadow_ms):
    step = lrn.plan(tokens)
    assert step.kind == "explore"
    return step, lrn.record(step, tokens, Outcome(served_ms=served_ms, shadow_ms=shadow_ms))


def test_plan_is_pure_until_recorded():
    lrn = learner()
    lrn.unlock()
    assert lrn.plan(100) == lrn.plan(100)
    assert lrn.plan(100).kind == "warmup"
    assert lrn.buckets == {}


def test_shadow_picks_the_count_with_fewest_samples_and_alternates_order():
    lrn = learner(k=2, configured=2, allowed=(1, 2, 4))
    lrn.unlock()
    lrn.record(lrn.plan(100), 100)  # warm-up
    shadows, orders = [], []
    for _ in range(4):
        step, _ = explore(lrn, 100, 1.0, 2.0)
        shadows.append(step.shadow)
        orders.append(step.shadow_first)
    assert shadows == [1, 4, 1, 4]
    assert orders == [False, True, False, True]


def test_equal_medians_keep_the_configured_count():
    lrn = learner(k=2, configured=2, allowed=(1, 2))
    lrn.unlock()
    lrn.record(lrn.plan(100), 100)
    explore(lrn, 100, 3.0, 3.0)
    _, events = explore(lrn, 100, 3.0, 3.0)
    assert [e.name for e in events] == ["threads_learned"]
    assert lrn.buckets[6].learned == 2


def test_median_not_mean_decides():
    lrn = learner(k=3, configured=1, allowed=(1, 2))
    lrn.unlock()
    lrn.record(lrn.plan(100), 100)
    # count 2 has one huge outlier (thread-pool start) but a lower median
    for served, shadow in [(5.0, 500.0), (5.0, 4.0), (5.0, 4.0)]:
        explore(lrn, 100, served, shadow)
    assert lrn.buckets[6].learned == 2


def test_suggested_threads_weighs_buckets_by_tokens_served():
    lrn = learner(k=1)
    lrn.unlock()
    for tokens, served, shadow in [(8, 1.0, 2.0), (1000, 9.0, 5.0)]:
        lrn.record(lrn.plan(tokens), tokens)
        explore(lrn, tokens, served, shadow)
    assert lrn.buckets[3].learned == 1
    assert lrn.buckets[9].learned == 2
    for _ in range(50):  # many short batches, still fewer tokens than the long ones
        lrn.record(lrn.plan(8), 8)
    assert lrn.suggested_threads() == 2
    for _ in range(300):
        lrn.record(lrn.plan(8), 8)
    assert lrn.suggested_threads() == 1


def test_records_before_unlock_are_ignored():
    lrn = learner()
    step = lrn.plan(100)
    assert step.kind == "plain"
    assert lrn.record(step, 100) == []
    assert lrn.report()["table"] == {}
    assert lrn.status() == "locked"
