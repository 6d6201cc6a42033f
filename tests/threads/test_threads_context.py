import threading

import pytest
import torch

from sr.worker.threads import THREADS, ForwardRunner, ThreadContext


def test_set_num_threads_runs_only_when_the_count_changes():
    context = ThreadContext()
    torch.set_num_threads(2)
    for _ in range(5):
        with context.use(2):
            assert torch.get_num_threads() == 2
    assert context.set_calls == 0
    for threads in (1, 1, 2, 2, 1):
        with context.use(threads):
            assert torch.get_num_threads() == threads
    assert context.set_calls == 3


def test_call_runs_before_then_fn_at_the_count_and_counts_changes_as_use_does():
    context = ThreadContext()
    torch.set_num_threads(2)
    seen = []
    assert context.call(2, lambda: torch.get_num_threads()) == 2
    assert context.set_calls == 0
    result = context.call(
        1, lambda: seen.append(("fn", torch.get_num_threads())) or "answer",
        lambda: seen.append(("before", torch.get_num_threads())),
    )  # fmt: skip
    assert result == "answer"
    assert seen == [("before", 1), ("fn", 1)]
    assert context.set_calls == 1
    with pytest.raises(ValueError):
        context.call(0, lambda: None)


def test_a_count_changed_behind_the_context_is_reapplied():
    context = ThreadContext()
    with context.use(1):
        pass
    torch.set_num_threads(2)  # someone outside the context
    with context.use(1):
        assert torch.get_num_threads() == 1


def test_two_workers_in_one_process_never_inherit_each_others_count():
    # Two runners on the shared context, each driven from its own thread, interleaving.
    seen: dict[str, list[int]] = {"one": [], "two": []}
    runners = {"one": ForwardRunner(1, context=THREADS), "two": ForwardRunner(2, context=THREADS)}
    start = threading.Barrier(2)
    weights = torch.randn(64, 64)

    def worker(name: str) -> None:
        start.wait()
        for _ in range(200):

            def forward():
                seen[name].append(torch.get_num_threads())
                return weights @ weights

            runners[name].run(forward, padded_tokens=64)

    threads = [threading.Thread(target=worker, args=(name,)) for name in runners]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=15)
    assert not any(t.is_alive() for t in threads)
    assert seen["one"] == [1] * 200
    assert seen["two"] == [2] * 200


def test_interleaved_learning_runners_keep_their_own_counts():
    # With learning on, each run may use several counts; every one of them must be
    # a count that runner allows, never the other runner's configured count leaking in.
    from threads_fakes import CostedForward, FakeClock

    clock = FakeClock()
    low = ForwardRunner(1, mode=1, budget=1, clock=clock)  # only 1 allowed: nothing to learn
    high = ForwardRunner(2, mode=1, budget=2, clock=clock)
    low.unlock()
    high.unlock()
    low_forward = CostedForward(clock, {1: 1.0, 2: 1.0})
    high_forward = CostedForward(clock, {1: 1.0, 2: 1.0})
    for _ in range(20):
        low.run(low_forward, 100)
        high.run(high_forward, 100)
    assert set(low_forward.counts()) == {1}
    assert set(high_forward.counts()) == {1, 2}
    assert low.report()["status"] == "stopped"
    assert "only allowed thread count" in low.report()["reason"]
