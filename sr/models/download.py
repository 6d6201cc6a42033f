"""Opt-in model download: `sr serve --download` fetches what does not resolve offline.

Run once in the `sr serve` process before the config is written and before any worker
starts: every distinct (artifact, revision) of a managed deployment is first resolved
offline (`resolve_artifact`); only a repository ID that misses is fetched, with
`huggingface_hub.snapshot_download` into the hub cache that resolution reads
(`ModelSources.hub_cache`, sr.settings), so the offline resolution then finds it, pinned
revision included.
Absolute paths are never downloaded. A LoRA adapter (adapter_config.json) is fetched like a
model, and then its base (`base_model_name_or_path` at its `revision`) like any artifact,
when that does not resolve offline either.

Only the files sr reads are fetched (allow_patterns), in two passes at one commit:
  1. config.json, model.safetensors, tokenizer.json, modules.json,
     sentence_bert_config.json, config_sentence_transformers.json, adapter_config.json,
     adapter_model.safetensors;
  2. the module folders modules.json names: Pooling and Normalize `<path>/config.json`,
     Dense `<path>/config.json` and `<path>/model.safetensors`.

`huggingface_hub` is imported here, lazily, only when something has to be fetched. It
reads HF_TOKEN (sent as `Authorization: Bearer`; sr never prints it) and HF_ENDPOINT
itself; sr passes HF_ENDPOINT on explicitly as well, because huggingface_hub reads it
once at import and an embedding program may have imported it before setting it.
HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE, which huggingface_hub treats alike) turns
downloads off: a needed download is then a DownloadFailed saying so, and nothing is sent.

Every failure is one DownloadFailed (a StartupFailed) whose message is one line naming
the artifact and the cause.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TextIO

from sr.config.schema import Deployment, SrConfig
from sr.errors import ArtifactNotFound, DownloadFailed
from sr.models.artifacts import _REPO_ID, REQUIRED_FILES, resolve_artifact
from sr.models.lora_config import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    adapter_base,
    adapter_folder_problem,
    is_adapter_folder,
)
from sr.settings import ModelSources, read_process_settings

# Top-level files sr reads (sr.models.artifacts, sr.models.checkpoint, sr.models.encoder).
TOP_LEVEL_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    ADAPTER_CONFIG,  # a LoRA adapter's (sr.models.lora_config)
    ADAPTER_WEIGHTS,
)
# sentence-transformers modules whose folders (named by modules.json) sr reads.
MODULE_FILES = {
    "Pooling": ("config.json",),
    "Normalize": ("config.json",),
    "Dense": ("config.json", "model.safetensors"),
}
_ST = "sentence_transformers.models."


def label(artifact: str, revision: str | None) -> str:
    """`org/name (revision X)`, as the progress and error lines name an artifact."""
    return f"{artifact} (revision {revision or 'main'})"


def _is_path(artifact: str) -> bool:
    return artifact.startswith(("/", "~")) or os.path.isabs(artifact)


def _managed(deployment: Deployment) -> bool:
    return any(not replica.attached for replica in deployment.placements())


def missing_artifacts(config: SrConfig, sources: ModelSources) -> list[tuple[str, str | None]]:
    """The distinct (artifact, revision) of managed deployments that a download could
    supply and that do not resolve offline now, in config order, with the bases of the
    adapters that do resolve."""
    missing: list[tuple[str, str | None]] = []
    for deployment in config.deployments.values():
        key = (deployment.artifact, deployment.revision)
        if not _managed(deployment) or key in missing:
            continue
        downloadable = _downloadable(deployment.artifact)
        try:
            folder = resolve_artifact(*key, sources=sources)
        except ArtifactNotFound:
            if downloadable:
                missing.append(key)
            continue  # else never downloaded: the worker reports it as before
        base = _missing_base(folder, sources)
        if base is not None and base not in missing:
            missing.append(base)
    return missing


def _downloadable(artifact: str) -> bool:
    return not _is_path(artifact) and bool(_REPO_ID.match(artifact))


def _missing_base(folder: Path, sources: ModelSources) -> tuple[str, str | None] | None:
    """An adapter folder's base, when a download could supply it and it does not resolve."""
    base = adapter_base(folder)
    if base is None or not _downloadable(base[0]):
        return None
    try:
        resolve_artifact(*base, sources=sources)
    except ArtifactNotFound:
        return base
    return None


def _module_patterns(snapshot: Path) -> list[str]:
    """allow_patterns for the module folders the snapshot's modules.json names."""
    try:
        modules = json.loads((snapshot / "modules.json").read_text())
    except (OSError, ValueError):
        return []  # none (plain encoder), or unreadable: loading reports it
    if not isinstance(modules, list):
        return []
    patterns: list[str] = []
    for module in modules:
        if not isinstance(module, dict):
            continue
        kind = str(module.get("type", "")).removeprefix(_ST)
        folder = str(module.get("path") or "").strip("/")
        parts = PurePosixPath(folder).parts
        if kind not in MODULE_FILES or not folder or ".." in parts or "\\" in folder:
            continue
        patterns += [glob.escape(f"{folder}/{name}") for name in MODULE_FILES[kind]]
    return patterns


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def describe_failure(error: BaseException, revision: str | None, endpoint: str) -> str:
    """One short cause for an exception out of huggingface_hub (never a header or token)."""
    from huggingface_hub import utils as hf  # these names exist from 0.23 to 2.x

    status = getattr(getattr(error, "response", None), "status_code", None)
    if isinstance(error, hf.GatedRepoError):
        return f"gated repository on {endpoint}: access not granted (HF_TOKEN)"
    if isinstance(error, hf.RepositoryNotFoundError):
        return (
            f"repository not found on {endpoint} (HTTP {status}; "
            "a private or gated one needs HF_TOKEN with access)"
        )
    if isinstance(error, hf.RevisionNotFoundError):
        return f"revision {revision or 'main'!r} not found on {endpoint}"
    if isinstance(error, hf.LocalEntryNotFoundError):
        # huggingface_hub falls back to the cache when the Hub is unreachable; why it
        # could not reach it is the exception's cause.
        cause = error.__cause__ or error.__context__
        if cause is not None and not isinstance(cause, hf.LocalEntryNotFoundError):
            return f"cannot reach {endpoint}: {_first_line(cause)}"
        return f"cannot reach {endpoint}"
    if isinstance(error, hf.EntryNotFoundError):
        return f"a file is missing on {endpoint} (HTTP {status})"
    if isinstance(error, hf.HfHubHTTPError) and status in (401, 403):
        return f"access denied by {endpoint} (HTTP {status}): check HF_TOKEN"
    if isinstance(error, hf.HfHubHTTPError) and status is not None:
        return f"HTTP {status} from {endpoint}"
    if isinstance(error, OSError) and error.strerror:
        where = f" {error.filename}" if error.filename else ""
        return f"cannot write{where}: {error.strerror}"
    return f"{type(error).__name__}: {_first_line(error)}"


@contextlib.contextmanager
def _library_quiet() -> Iterator[None]:
    """huggingface_hub logs what it works around (a cache file it could not write, a
    retry); a failure is then raised, and sr reports it as its one line."""
    library = logging.getLogger("huggingface_hub")
    level = library.level
    library.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        library.setLevel(level)


def download_artifact(
    artifact: str, revision: str | None = None, *, sources: ModelSources | None = None
) -> Path:
    """Fetch the files sr reads of one Hub repository into the hub cache and return the
    folder `resolve_artifact(artifact, revision)` now finds. DownloadFailed otherwise.
    `sources`: the hub cache, endpoint and offline switch (default: this process's)."""
    sources = sources if sources is not None else read_process_settings().models
    name = label(artifact, revision)
    offline = sources.offline_variable
    if offline is not None:
        raise DownloadFailed(f"cannot download {name}: downloads are off because {offline} is set")
    try:
        from huggingface_hub import constants, snapshot_download
    except ImportError:
        raise DownloadFailed(
            f"cannot download {name}: huggingface_hub is not installed"
            " (pip install 'huggingface_hub>=0.23,<3')"
        ) from None
    endpoint = sources.hf_endpoint
    shown = endpoint or constants.ENDPOINT
    cache = sources.hub_cache
    try:
        with _library_quiet():
            snapshot = _fetch(artifact, revision, cache, endpoint, snapshot_download)
    except Exception as error:  # one line, whatever huggingface_hub raised
        cause = describe_failure(error, revision, shown)
        raise DownloadFailed(f"cannot download {name}: {cause}") from None
    try:
        return resolve_artifact(artifact, revision, sources=sources)
    except ArtifactNotFound:
        lacking = [f for f in REQUIRED_FILES if not (snapshot / f).is_file()]
        what = ", ".join(lacking) if lacking else "a resolvable snapshot"
        if is_adapter_folder(snapshot):
            why = adapter_folder_problem(snapshot)
            raise DownloadFailed(
                f"cannot download {name}: the repository (commit {snapshot.name}) {why}"
            ) from None
        raise DownloadFailed(
            f"cannot download {name}: the repository (commit {snapshot.name}) has no {what};"
            f" sr needs {', '.join(REQUIRED_FILES)}"
        ) from None


def _fetch(
    artifact: str, revision: str | None, cache: Path, endpoint: str | None, snapshot_download
) -> Path:
    """The two passes at one commit: top-level files, then the module folders."""
    snapshot = Path(
        snapshot_download(
            artifact,
            revision=revision,
            cache_dir=cache,
            allow_patterns=list(TOP_LEVEL_FILES),
            endpoint=endpoint,
        )
    )
    modules = _module_patterns(snapshot)
    if modules:
        # At the commit of the first pass (the snapshot folder's name), even if the
        # branch moved meanwhile.
        snapshot_download(
            artifact,
            revision=snapshot.name,
            cache_dir=cache,
            allow_patterns=modules,
            endpoint=endpoint,
        )
    return snapshot


def download_missing(
    config: SrConfig, *, out: TextIO | None = None, sources: ModelSources | None = None
) -> dict[str, Path]:
    """`sr serve --download`: fetch every artifact of `config` that does not resolve offline,
    once per distinct (artifact, revision), printing one line before and after each.
    Returns {label: folder} of what was fetched; DownloadFailed on the first failure."""
    sources = sources if sources is not None else read_process_settings().models
    out = sys.stdout if out is None else out
    missing = missing_artifacts(config, sources)
    if not missing:
        return {}
    offline = sources.offline_variable
    if offline is not None:
        names = ", ".join(label(*key) for key in missing)
        raise DownloadFailed(
            f"cannot download {names}: downloads are off because {offline} is set"
            " (unset it, or put the model in the hub cache or $SR_MODEL_DIR)"
        )
    fetched: dict[str, Path] = {}
    while missing:
        artifact, revision = missing.pop(0)
        name = label(artifact, revision)
        print(f"sr: downloading {name} ...", file=out, flush=True)
        folder = download_artifact(artifact, revision, sources=sources)
        print(f"sr: downloaded {artifact} -> {folder}", file=out, flush=True)
        fetched[name] = folder
        base = _missing_base(folder, sources)  # an adapter just fetched needs its base
        if base is not None and base not in missing and label(*base) not in fetched:
            missing.append(base)
    return fetched
