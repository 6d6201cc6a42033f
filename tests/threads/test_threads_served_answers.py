"""Mode 1 never changes a served answer: the same requests give the same bytes on and off."""

import pytest
import torch
from threads_fakes import CostedForward, FakeClock

from sr import models
from sr.worker.adaptive import LearningSettings
from sr.worker.threads import ForwardRunner

TEXTS = [
    "hi",
    "a short question about threads",
    "a much longer passage " * 12,
    "ok",
    "which count is fastest for long inputs on a shared host? " * 6,
    "bit for bit",
]


def serve_all(runner, batches):
    """Run each (forward, padded_tokens) and return the served answers as bytes."""
    runner.unlock()
    return [runner.run(forward, tokens).numpy().tobytes() for forward, tokens in batches]


def torch_batches():
    generator = torch.Generator().manual_seed(7)
    weights = torch.randn(768, 384, generator=generator)
    batches = []
    for rows in [1, 3, 17, 64, 2, 33, 128, 5] * 3:
        x = torch.randn(rows, 768, generator=generator)
        batches.append((lambda x=x: torch.tanh(x @ weights).sum(dim=0), rows * 8))
    return batches


@pytest.mark.parametrize("mode", [1, 2])
def test_real_matmuls_give_the_same_bytes_with_learning_on_and_off(mode):
    batches = torch_batches()
    off = serve_all(ForwardRunner(1, mode=0), batches)
    # Mode 2 only keeps the configured bytes inside its window, so the window covers all.
    settings = LearningSettings(min_samples=2, window=len(batches))
    learning = ForwardRunner(1, mode=mode, budget=2, settings=settings)
    on = serve_all(learning, batches)
    assert on == off
    # Whatever this host did (learned or drifted), learning really ran.
    assert learning.report()["shadows"] > 0


def test_a_count_that_drifts_never_reaches_the_answer():
    clock = FakeClock()
    drifting = CostedForward(clock, {1: 5.0, 2: 1.0}, drift=lambda threads: threads == 2)
    batches = [(drifting, tokens) for tokens in (10, 10, 10, 300, 300, 300)]
    off = serve_all(ForwardRunner(1, mode=0, clock=clock), batches)
    on_runner = ForwardRunner(1, mode=1, budget=2, clock=clock)
    on = serve_all(on_runner, batches)
    assert on == off
    assert on_runner.report()["status"] == "stopped"


def test_embedded_minilm_gives_the_same_bytes_with_learning_on_and_off():
    model = models.load_model(models.resolve_artifact("sentence-transformers/all-MiniLM-L6-v2"))
    ids = model.tokenize(TEXTS)
    batches = []
    for start in range(0, len(ids), 2):
        batch = ids[start : start + 2]
        padded = len(batch) * max(len(row) for row in batch)
        batches.append((lambda batch=batch: model.embed(batch), padded))
    batches = batches * 3
    off = serve_all(ForwardRunner(1, mode=0), batches)
    learning = ForwardRunner(1, mode=1, budget=2, settings=LearningSettings(min_samples=2))
    on = serve_all(learning, batches)
    assert on == off
    assert learning.report()["shadows"] > 0
