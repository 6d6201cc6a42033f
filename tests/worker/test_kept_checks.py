"""A worker's golden check and batching probe kept per host (sr.worker.kept_checks): a later
start with the same key runs the golden inputs once and takes the kept results only when its
answers are the same bits; anything else runs both in full."""

import json

import pytest
from worker_fakes import running

from sr.models import EMBEDDED_DEFAULT, load_model, probe_cache, resolve_artifact
from sr.models.golden import GoldenResult, golden_check
from sr.worker import kept_checks
from sr.worker.kept_checks import start_checks
from sr.worker.options import WorkerOptions
from sr.worker.threads import ForwardRunner


@pytest.fixture
def kept_file(tmp_path):
    return probe_cache.start_checks_file(tmp_path)


@pytest.fixture
def probes(monkeypatch):
    """How many times the batching probe ran in full."""
    calls = []
    real = kept_checks.batch_invariance_probe

    def counted(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(kept_checks, "batch_invariance_probe", counted)
    return calls


def _minilm():
    return load_model(resolve_artifact(EMBEDDED_DEFAULT))


def test_a_second_start_takes_the_kept_results_after_one_golden_run(kept_file, probes):
    first_golden, first_probe = start_checks(_minilm(), ForwardRunner(1), 256, kept_file)
    assert first_golden.passed and first_probe.passed
    assert len(probes) == 1 and kept_file.is_file()

    model = _minilm()  # another load of the same weights, as a restarted worker's
    runs = []
    real_embed = model.embed
    model.embed = lambda ids: runs.append(len(ids)) or real_embed(ids)
    golden, probe = start_checks(model, ForwardRunner(1), 256, kept_file)
    assert runs == [8]  # the golden inputs once: no rerun, no probe forward
    assert len(probes) == 1
    assert golden.passed and golden.max_abs_diff == first_golden.max_abs_diff
    assert golden.reference == "golden_minilm.json" and golden.against == first_golden.against
    assert golden.reason.startswith(first_golden.reason)
    assert "kept from an earlier start" in golden.reason
    assert probe.passed and probe.detail == first_probe.detail + " (probed at an earlier start)"


def test_other_answers_run_both_in_full_and_the_pass_is_kept_anew(kept_file, probes):
    start_checks(_minilm(), ForwardRunner(1), 256, kept_file)
    model = _minilm()
    original = model.backbone.hidden_states

    def nudged(ids, lengths):  # other bits, still within the reference's bound
        return original(ids, lengths) + 1e-6

    model.backbone.hidden_states = nudged
    golden, probe = start_checks(model, ForwardRunner(1), 256, kept_file)
    assert len(probes) == 2
    assert "kept" not in golden.reason and "earlier start" not in probe.detail
    entry = next(iter(json.loads(kept_file.read_text()).values()))
    assert entry["probe"] == probe.card()


def test_a_failed_check_is_never_kept(tiny_model_dir, kept_file, probes):
    def failing(model, first=None):
        return GoldenResult("failed", "reruns differ (max abs diff 1)")

    golden, probe = start_checks(
        load_model(tiny_model_dir), ForwardRunner(1), 64, kept_file, failing
    )
    assert not golden.passed and probe is None
    assert probes == [] and not kept_file.exists()


@pytest.mark.parametrize(
    "damage",
    [
        lambda golden: {"status": "passed"},  # the reason and more are missing
        lambda golden: {**golden, "status": "failed"},  # no file sr wrote holds a failure
    ],
)
def test_a_damaged_entry_runs_both_in_full(tiny_model_dir, kept_file, probes, damage):
    start_checks(load_model(tiny_model_dir), ForwardRunner(1), 64, kept_file)
    entries = json.loads(kept_file.read_text())
    for entry in entries.values():
        entry["golden"] = damage(entry["golden"])
    kept_file.write_text(json.dumps(entries))
    golden, probe = start_checks(load_model(tiny_model_dir), ForwardRunner(1), 64, kept_file)
    assert golden.passed and "kept" not in golden.reason
    assert "earlier start" not in probe.detail and len(probes) == 2


def test_without_a_file_both_run_in_full_with_the_check_given(tiny_model_dir, probes):
    seen = []

    def check(model):
        seen.append(model)
        return golden_check(model)

    model = load_model(tiny_model_dir)
    golden, probe = start_checks(model, ForwardRunner(1), 64, None, check)
    assert seen == [model] and golden.passed and probe.passed and len(probes) == 1


def test_the_key_names_threads_input_cap_and_weights(tiny_model_dir):
    model = load_model(tiny_model_dir)
    key = kept_checks.check_key(model, 1, 64, model.weights_sha256)
    assert key == kept_checks.check_key(load_model(tiny_model_dir), 1, 64, model.weights_sha256)
    assert key != kept_checks.check_key(model, 2, 64, model.weights_sha256)
    assert key != kept_checks.check_key(model, 1, 32, model.weights_sha256)
    assert key != kept_checks.check_key(model, 1, 64, "0" * 64)


async def test_a_restarted_worker_reports_the_kept_checks_on_its_card(
    tiny_model_dir, tmp_path, monkeypatch, probes
):
    monkeypatch.setenv("SR_CACHE_DIR", str(tmp_path / "cache"))
    options = WorkerOptions(artifact=str(tiny_model_dir))
    async with running(options) as first:
        first_card = first.card()
    async with running(options) as again:
        card = again.card()
    assert card["state"] == "ready" and len(probes) == 1
    assert "kept from an earlier start" in card["golden"]["reason"]
    assert card["batching"]["probe"]["detail"].endswith("(probed at an earlier start)")
    assert card["batching"]["exact_batching"] == first_card["batching"]["exact_batching"]
    # An injected golden check is not sr's own: nothing kept is used.
    async with running(options, golden_check_fn=lambda model: golden_check(model)) as injected:
        assert "kept" not in injected.card()["golden"]["reason"]
    assert len(probes) == 2
