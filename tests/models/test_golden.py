import json
import threading

import pytest
import torch

from sr.models import EMBEDDED_DEFAULT, load_model, resolve_artifact
from sr.models.golden import GOLDEN_INPUTS, REFERENCE_FILES, golden_check, golden_token_ids


@pytest.fixture(scope="module")
def minilm():
    return load_model(resolve_artifact(EMBEDDED_DEFAULT))


def test_recorded_reference_is_for_the_embedded_weights(minilm):
    reference = json.loads(REFERENCE_FILES[0].read_text())
    assert reference["weights_sha256"] == minilm.weights_sha256
    assert reference["inputs"] == list(GOLDEN_INPUTS)
    assert len(reference["embeddings"]) == len(GOLDEN_INPUTS)
    assert "sentence-transformers" in reference["produced_by"]


def test_minilm_matches_sentence_transformers_reference(minilm):
    reference = json.loads(REFERENCE_FILES[0].read_text())
    expected = torch.tensor(reference["embeddings"])
    got = minilm.embed(golden_token_ids(minilm))
    assert got.shape == (8, 384)
    assert (got - expected).abs().max() <= 1e-5
    # Alone or together, the same bits.
    for i, row in enumerate(golden_token_ids(minilm)):
        assert torch.equal(minilm.embed([row])[0], got[i])


def test_golden_check_passes_on_minilm(minilm):
    result = golden_check(minilm)
    assert result.status == "passed", result.reason
    assert result.reference == "golden_minilm.json"
    assert result.max_abs_diff is not None and result.max_abs_diff <= 1e-5


def test_golden_check_fails_when_the_forward_is_perturbed(minilm, monkeypatch):
    original = minilm.backbone.hidden_states

    def shifted(ids, lengths):
        return original(ids, lengths) + 1e-3

    monkeypatch.setattr(minilm.backbone, "hidden_states", shifted)
    result = golden_check(minilm)
    assert result.status == "failed"
    assert "exceeds 1e-05" in result.reason
    assert result.max_abs_diff > 1e-5


def test_golden_check_fails_when_reruns_differ(tiny_model_dir, monkeypatch):
    model = load_model(tiny_model_dir)
    original = model.backbone.hidden_states
    calls = iter(range(1000))

    def drifting(ids, lengths):
        return original(ids, lengths) + next(calls) * 1e-6

    monkeypatch.setattr(model.backbone, "hidden_states", drifting)
    result = golden_check(model)
    assert result.status == "failed"
    assert "reruns differ" in result.reason


def test_golden_check_without_reference_checks_reruns_only(tiny_model_dir):
    result = golden_check(load_model(tiny_model_dir))
    assert result.status == "passed"
    assert "no recorded reference" in result.reason
    assert result.max_abs_diff is None


def test_golden_check_compares_with_a_reference_for_matching_weights(tiny_model_dir, tmp_path):
    model = load_model(tiny_model_dir)
    vectors = model.embed(golden_token_ids(model))
    reference = {
        "weights_sha256": model.weights_sha256,
        "inputs": list(GOLDEN_INPUTS),
        "embeddings": (vectors + 2e-5).tolist(),
    }
    path = tmp_path / "ref.json"
    path.write_text(json.dumps(reference))
    result = golden_check(model, references=(path,))
    assert result.status == "failed" and result.reference == "ref.json"
    reference["embeddings"] = (vectors + 5e-6).tolist()
    path.write_text(json.dumps(reference))
    result = golden_check(model, references=(path,))
    assert result.status == "passed", result.reason


def test_golden_check_reports_a_crashing_forward_as_failed(tiny_model_dir, monkeypatch):
    model = load_model(tiny_model_dir)

    def broken(ids, lengths):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(model.backbone, "hidden_states", broken)
    result = golden_check(model)
    assert result.status == "failed" and "kernel exploded" in result.reason


@pytest.mark.parametrize("spare_core", [True, False])
def test_the_weights_digest_is_hashed_beside_the_forwards_only_with_a_core_to_spare(
    tiny_model_dir, monkeypatch, spare_core
):
    """Beside the forwards (a helper thread) where their threads leave a core free, else
    on the checking thread; the check's answer is the same either way."""
    from sr.models import encoder, golden

    hashed_on = []
    real_sha256 = encoder.file_sha256

    def file_sha256(path):
        hashed_on.append(threading.current_thread().name)
        return real_sha256(path)

    monkeypatch.setattr(encoder, "file_sha256", file_sha256)
    monkeypatch.setattr(golden, "cpu_budget", lambda: 2)
    before = torch.get_num_threads()
    torch.set_num_threads(1 if spare_core else 2)
    try:
        result = golden_check(load_model(tiny_model_dir))
    finally:
        torch.set_num_threads(before)
    assert result.status == "passed"
    assert len(hashed_on) == 1
    assert hashed_on[0].startswith("sr-golden-digest") == spare_core
