"""`sr serve --download` (sr.models.download) against a loopback imitation of the Hub.

No network: tests/models/hub_server.py answers the calls huggingface_hub's
`snapshot_download` makes (repo info, tree, HEAD/GET resolve, a CDN for LFS files);
HF_ENDPOINT points at it and HF_HUB_CACHE at tmp_path.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import httpx
import pytest
import torch
import yaml
from hub_server import HubRepo, HubServer, commit_id, read_folder

from sr.config.load import dump_config, parse_config
from sr.errors import ArtifactNotFound
from sr.models import load_model
from sr.models.artifacts import resolve_artifact
from sr.models.download import DownloadFailed, download_artifact, download_missing
from sr.models.testing import write_tiny_bert
from sr.router import serve_cli

REPO_ROOT = Path(__file__).resolve().parents[2]
CPU_HOST = {"SR_GPU_INVENTORY": ""}
TOKEN = "hf_TestTokenThatMustNeverBePrinted0123"
REPO = "acme/tiny-bert"
# What sr reads of the tiny sentence-transformers checkpoint, and nothing else.
SR_FILES = sorted(
    [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "modules.json",
        "sentence_bert_config.json",
        "config_sentence_transformers.json",
        "1_Pooling/config.json",
    ]
)
# Files of a real release that sr never reads: none of them may be fetched.
UNREAD_FILES = {
    ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
    "README.md": b"# tiny\n",
    "pytorch_model.bin": b"\0" * 256,
    "onnx/model.onnx": b"\0" * 128,
    "onnx/config.json": b"{}",
    "openvino/openvino_model.xml": b"<xml/>",
}
ST_CONFIG = b'{"__version__": {"sentence_transformers": "3.0.0"}, "prompts": {}}'


def repo_files(folder: Path) -> dict[str, bytes]:
    files = read_folder(folder)
    files.update(UNREAD_FILES)
    files["config_sentence_transformers.json"] = ST_CONFIG
    return files


@pytest.fixture(scope="session")
def tiny_versions(tmp_path_factory) -> dict[str, dict[str, bytes]]:
    """Two commits of the tiny checkpoint (different weights): "old" and "new"."""
    base = tmp_path_factory.mktemp("hub-repos")
    return {
        "old": repo_files(write_tiny_bert(base / "old", seed=0)),
        "new": repo_files(write_tiny_bert(base / "new", seed=3)),
    }


OLD, NEW = commit_id("tiny-bert old"), commit_id("tiny-bert new")


@pytest.fixture
def tiny_repo(tiny_versions) -> HubRepo:
    """main -> NEW, tag v1 -> OLD."""
    return HubRepo(
        commits={OLD: tiny_versions["old"], NEW: tiny_versions["new"]},
        refs={"main": NEW, "v1": OLD},
    )


@pytest.fixture
def hub_env(monkeypatch, tmp_path) -> Path:
    """A clean Hugging Face environment: the hub cache in tmp_path, no token, online."""
    for name in (
        "SR_MODEL_DIR",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_ENDPOINT",
        "HF_HUB_DISABLE_IMPLICIT_TOKEN",
        "HF_OIDC_RESOURCE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no stored token there
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


def _keep_huggingface_hub_on_loopback(monkeypatch, home: Path) -> None:
    """huggingface_hub reads HF_ENDPOINT, HF_HUB_OFFLINE and HF_HOME once, at import, and
    another test of the session may have imported it already (transformers does). sr passes
    HF_ENDPOINT on itself; the library's own once-a-process fetch of its agent registry
    from its import-time endpoint is skipped, offline mode is what the test sets, and no
    token stored on this machine is read."""
    from huggingface_hub import constants
    from huggingface_hub.utils import _detect_agent

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    monkeypatch.setattr(
        _detect_agent, "_registry", {"standardEnvVars": [], "harnesses": {}}, raising=False
    )


@pytest.fixture
def start_hub(hub_env, monkeypatch):
    """start_hub(repos, token=None) -> a running HubServer that HF_ENDPOINT points at."""
    servers: list[HubServer] = []

    def start(repos: dict[str, HubRepo], *, token: str | None = None) -> HubServer:
        server = HubServer(repos, token=token).__enter__()
        servers.append(server)
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        _keep_huggingface_hub_on_loopback(monkeypatch, hub_env.parent / "hf-home")
        return server

    yield start
    for server in servers:
        server.__exit__(None, None, None)


@pytest.fixture
def router(monkeypatch):
    """A stand-in for sr.router.serve that records the hand-over."""
    calls = []
    module = types.ModuleType("sr.router.serve")

    def run_sr_serve(
        config, *, config_path, host, port, threads, log_format, access_log, settings=None,
        write_config,
    ):  # fmt: skip
        write_config()  # as the router does once its listener is bound
        calls.append(config)
        return 0

    module.run_sr_serve = run_sr_serve
    monkeypatch.setitem(sys.modules, "sr.router.serve", module)
    return calls


def config_text(*deployments: dict) -> str:
    named = {f"d{i}": d for i, d in enumerate(deployments)}
    return yaml.safe_dump(
        {
            "global": {
                "model_catalog": {
                    "deployments": named,
                    "system": {"decision_model": {"deployment": "d0"}},
                }
            }
        }
    )


def managed(artifact: str, revision: str | None = None) -> dict:
    d: dict = {"artifact": artifact, "replicas": [{"device": "cpu"}]}
    if revision is not None:
        d["revision"] = revision
    return d


def serve(path: Path, *args: str) -> int:
    # The hub variables the fixtures set, on a host without GPUs.
    return serve_cli.main([*args, "--config", str(path)], env={**os.environ, **CPU_HOST})


def one_error_line(capsys) -> str:
    """The one line on stderr besides huggingface_hub's progress bars (tqdm's `\\r` lines)."""
    captured = capsys.readouterr()
    assert TOKEN not in captured.out + captured.err
    lines = [line for line in captured.err.split("\n") if line and "\r" not in line]
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    return lines[0]


def api_calls(hub: HubServer) -> list[str]:
    return [s.path.split("?")[0] for s in hub.requests if s.path.startswith("/api/models/")]


# ---- (a) fetch only what sr reads; then it resolves offline and loads ----------------


def test_download_fetches_only_what_sr_reads_and_the_model_loads(
    start_hub, tiny_repo, hub_env, tiny_versions, tmp_path
):
    hub = start_hub({REPO: tiny_repo})
    config = parse_config(config_text(managed(REPO)))
    with pytest.raises(ArtifactNotFound):
        resolve_artifact(REPO)
    out = io.StringIO()
    fetched = download_missing(config, out=out)

    folder = hub_env / "models--acme--tiny-bert" / "snapshots" / NEW
    assert fetched == {f"{REPO} (revision main)": folder}
    assert out.getvalue().splitlines() == [
        f"sr: downloading {REPO} (revision main) ...",
        f"sr: downloaded {REPO} -> {folder}",
    ]
    assert hub.fetched() == SR_FILES
    on_disk = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert on_disk == SR_FILES
    assert (hub_env / "models--acme--tiny-bert" / "refs" / "main").read_text() == NEW

    # Offline from now on: resolution finds the snapshot, and it loads and embeds like the
    # checkpoint it was served from.
    assert resolve_artifact(REPO) == folder
    source = tmp_path / "source"
    for name, content in tiny_versions["new"].items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(content)
    texts = ["hello world", "downloaded once"]
    got, want = load_model(folder), load_model(source)
    assert torch.equal(got.embed(got.tokenize(texts)), want.embed(want.tokenize(texts)))

    before = len(hub.requests)
    assert download_missing(config, out=out) == {}  # present now: nothing is asked
    assert len(hub.requests) == before


def test_sr_serve_download_fetches_once_per_artifact_and_revision_before_writing(
    start_hub, tiny_repo, hub_env, tmp_path, router, capsys
):
    hub = start_hub({REPO: tiny_repo})
    path = tmp_path / "config.yaml"
    path.write_text(
        config_text(
            managed(REPO),
            managed(REPO),  # the same (artifact, revision): fetched once
            managed(REPO, "v1"),
            {"artifact": "acme/remote", "endpoint": "http://10.0.0.5:8100", "model": "acme/remote"},
            managed("/nowhere/model"),  # a path: never downloaded
        )
    )
    assert serve(path, "--download", "-dp", "2") == 0  # -dp: the file is rewritten
    assert api_calls(hub) == [
        f"/api/models/{REPO}/revision/main",
        f"/api/models/{REPO}/tree/{NEW}",
        f"/api/models/{REPO}/revision/v1",
        f"/api/models/{REPO}/tree/{OLD}",
    ]
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"sr: downloading {REPO} (revision main) ...",
        f"sr: downloaded {REPO} -> {hub_env / 'models--acme--tiny-bert' / 'snapshots' / NEW}",
        f"sr: downloading {REPO} (revision v1) ...",
        f"sr: downloaded {REPO} -> {hub_env / 'models--acme--tiny-bert' / 'snapshots' / OLD}",
    ]
    assert path.read_text() == dump_config(router[0])  # written after the downloads


def test_dense_module_folders_are_fetched_and_nothing_else(start_hub, tiny_versions, hub_env):
    files = dict(tiny_versions["old"])
    kinds = [("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Dense", "Dense"),
             ("3_Normalize", "Normalize")]  # fmt: skip
    modules = [
        {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
        for i, (path, kind) in enumerate(kinds)
    ]
    files["modules.json"] = json.dumps(modules).encode()
    files["2_Dense/config.json"] = b'{"in_features": 32, "out_features": 8}'
    files["2_Dense/model.safetensors"] = b"dense weights"
    files["2_Dense/pytorch_model.bin"] = b"dense weights, pickled"
    files["4_Other/config.json"] = b"{}"
    hub = start_hub({"acme/dense": HubRepo(commits={OLD: files}, refs={"main": OLD})})
    download_artifact("acme/dense")
    assert hub.fetched() == sorted([*SR_FILES, "2_Dense/config.json", "2_Dense/model.safetensors"])


# ---- (b) a pinned revision -------------------------------------------------------------


@pytest.mark.parametrize("revision", ["v1", OLD])
def test_pinned_revision_is_the_snapshot_the_server_names(
    start_hub, tiny_repo, tiny_versions, hub_env, revision
):
    hub = start_hub({REPO: tiny_repo})
    folder = download_artifact(REPO, revision)
    root = hub_env / "models--acme--tiny-bert"
    assert folder == root / "snapshots" / OLD
    assert (folder / "model.safetensors").read_bytes() == tiny_versions["old"]["model.safetensors"]
    assert sorted(p.name for p in (root / "snapshots").iterdir()) == [OLD]
    refs = sorted(p.name for p in (root / "refs").iterdir()) if (root / "refs").exists() else []
    assert refs == (["v1"] if revision == "v1" else [])  # a commit needs no ref
    assert resolve_artifact(REPO, revision) == folder
    assert all(f"/{NEW}/" not in s.path for s in hub.requests)


# ---- (c) failures: one line, exit 1, config untouched ----------------------------------


def test_repository_not_found_is_one_line_and_leaves_the_config_alone(
    start_hub, tiny_repo, tmp_path, router, capsys
):
    hub = start_hub({REPO: tiny_repo})
    path = tmp_path / "config.yaml"
    path.write_text("# hand-written\n" + config_text(managed("acme/missing")))
    before = path.read_bytes()
    assert serve(path, "--download", "-dp", "2") == 1  # -dp would rewrite the file
    assert one_error_line(capsys) == (
        "sr serve: startup failed: cannot download acme/missing (revision main): repository"
        f" not found on {hub.url} (HTTP 404; a private or gated one needs HF_TOKEN with access)"
    )
    assert path.read_bytes() == before
    assert router == []

    missing = tmp_path / "absent.yaml"  # a config that does not exist is not created
    assert serve(missing, "acme/missing", "--download") == 1
    capsys.readouterr()
    assert not missing.exists()


@pytest.mark.parametrize(
    ("endpoint", "cache", "revision", "cause"),
    [
        ("hub", None, "v9", "revision 'v9' not found on {url}"),
        ("closed", None, None, "cannot reach {url}: [Errno 111] Connection refused"),
        ("hub", "under-a-file", None, "cannot write {cache}: Not a directory"),
    ],
)
def test_other_failures_are_one_line(
    start_hub, tiny_repo, tmp_path, monkeypatch, router, capsys, endpoint, cache, revision, cause
):
    hub = start_hub({REPO: tiny_repo})
    url = hub.url
    if endpoint == "closed":
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        monkeypatch.setenv("HF_ENDPOINT", url)
    cache_dir = tmp_path / "hub"
    if cache == "under-a-file":
        (tmp_path / "a-file").write_text("")
        cache_dir = tmp_path / "a-file" / "hub"
        monkeypatch.setenv("HF_HUB_CACHE", str(cache_dir))
    path = tmp_path / "config.yaml"
    path.write_text(config_text(managed(REPO, revision)))
    before = path.read_bytes()
    assert serve(path, "--download") == 1
    label = f"{REPO} (revision {revision or 'main'})"
    expected = cause.format(url=url, cache=cache_dir)
    assert (
        one_error_line(capsys) == f"sr serve: startup failed: cannot download {label}: {expected}"
    )
    assert path.read_bytes() == before


def test_a_repository_without_the_files_sr_needs_is_named(start_hub, tiny_versions):
    files = {k: v for k, v in tiny_versions["old"].items() if k != "model.safetensors"}
    files["pytorch_model.bin"] = b"pickled"
    hub = start_hub({"acme/old": HubRepo(commits={OLD: files}, refs={"main": OLD})})
    with pytest.raises(DownloadFailed) as caught:
        download_artifact("acme/old")
    assert str(caught.value) == (
        f"cannot download acme/old (revision main): the repository (commit {OLD}) has no"
        " model.safetensors; sr needs config.json, model.safetensors, tokenizer.json"
    )
    assert "pytorch_model.bin" not in hub.fetched()


# ---- (d) HF_HUB_OFFLINE ------------------------------------------------------------------


@pytest.mark.parametrize("variable", ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
def test_offline_variable_turns_downloads_off(
    start_hub, tiny_repo, tmp_path, monkeypatch, router, capsys, variable
):
    hub = start_hub({REPO: tiny_repo})
    monkeypatch.setenv(variable, "1")
    path = tmp_path / "config.yaml"
    path.write_text(config_text(managed(REPO), managed(REPO, "v1")))
    before = path.read_bytes()
    assert serve(path, "--download") == 1
    assert one_error_line(capsys) == (
        f"sr serve: startup failed: cannot download {REPO} (revision main), {REPO} (revision v1):"
        f" downloads are off because {variable} is set"
        " (unset it, or put the model in the hub cache or $SR_MODEL_DIR)"
    )
    assert hub.requests == []
    assert path.read_bytes() == before and router == []


def test_offline_with_everything_cached_starts(start_hub, tiny_repo, tmp_path, monkeypatch, router):
    hub = start_hub({REPO: tiny_repo})
    download_artifact(REPO)
    seen = len(hub.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = tmp_path / "config.yaml"
    path.write_text(config_text(managed(REPO)))
    assert serve(path, "--download") == 0
    assert len(hub.requests) == seen and len(router) == 1


# ---- (e) without --download nothing changes ----------------------------------------------


def test_without_the_flag_a_missing_artifact_fails_offline_as_before(
    start_hub, tiny_repo, tmp_path, router, capsys
):
    hub = start_hub({REPO: tiny_repo})
    path = tmp_path / "config.yaml"
    path.write_text(config_text(managed(REPO)))
    assert serve(path) == 0  # handed to the router; its worker reports the miss
    assert capsys.readouterr().out == ""
    with pytest.raises(ArtifactNotFound, match=r"not found offline; looked in: "):
        resolve_artifact(REPO)
    assert hub.requests == []


def test_huggingface_hub_is_imported_only_for_a_download(tmp_path, tiny_model_dir):
    """In a fresh interpreter: neither `sr serve` nor `sr serve --download` with nothing to
    fetch imports huggingface_hub."""
    path = tmp_path / "config.yaml"
    path.write_text(config_text(managed(str(tiny_model_dir))))
    script = (
        "import sys, types\n"
        "stub = types.ModuleType('sr.router.serve')\n"
        "stub.run_sr_serve = lambda config, **kw: 0\n"
        "sys.modules['sr.router.serve'] = stub\n"
        "from sr.router import serve_cli\n"
        "for extra in ([], ['--download']):\n"
        "    assert serve_cli.main([*extra, '--config', sys.argv[1]], env={}) == 0\n"
        "    print(extra, 'huggingface_hub' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "SR_GPU_INVENTORY": ""}
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[] False", "['--download'] False"]


# ---- (f) HF_TOKEN ----------------------------------------------------------------------------


def test_hf_token_is_sent_as_bearer_and_never_printed(
    start_hub, tiny_repo, monkeypatch, tmp_path, router, capsys
):
    private = HubRepo(commits=tiny_repo.commits, refs=tiny_repo.refs, private=True)
    hub = start_hub({"acme/private": private}, token=TOKEN)
    path = tmp_path / "config.yaml"
    path.write_text(config_text(managed("acme/private")))

    assert serve(path, "--download") == 1  # no token: a private repository is "not found"
    assert "repository not found" in one_error_line(capsys)

    monkeypatch.setenv("HF_TOKEN", TOKEN + "-wrong")
    assert serve(path, "--download") == 1
    assert one_error_line(capsys).endswith(f"access denied by {hub.url} (HTTP 401): check HF_TOKEN")

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    start = len(hub.requests)
    assert serve(path, "--download") == 0
    captured = capsys.readouterr()
    assert TOKEN not in captured.out + captured.err
    sent = hub.requests[start:]
    assert sent and all(
        s.headers.get("authorization") == f"Bearer {TOKEN}" for s in sent if s.server == "hub"
    )
    cdn = [s for s in sent if s.server == "cdn"]
    assert cdn and all("authorization" not in s.headers for s in cdn)  # off the Hub: no token
    assert hub.fetched() == SR_FILES


# ---- the real command, end to end ------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _sr_serve_env(hub: HubServer, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.pop("SR_MODEL_DIR", None)
    env.pop("TRANSFORMERS_OFFLINE", None)
    return {
        **env,
        "PYTHONPATH": str(REPO_ROOT),
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "HF_TOKEN": TOKEN,
        "VLLM_SRUN_CPU_THREADS": "1",
        "VLLM_SRUN_READY_TIMEOUT": "60s",
    }


@pytest.mark.e2e
def test_sr_serve_download_end_to_end(start_hub, tiny_repo, tmp_path):
    hub = start_hub({REPO: tiny_repo}, token=TOKEN)
    (tmp_path / "config.yaml").write_text(config_text(managed(REPO)))
    port = _free_port()
    argv = [sys.executable, "-m", "sr", "serve", "--download", "--config", "config.yaml"]
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [*argv, "--port", str(port)], cwd=tmp_path, env=_sr_serve_env(hub, tmp_path),
            stdout=stdout, stderr=stderr,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        ready = False
        while not ready and time.monotonic() < deadline and proc.poll() is None:
            try:
                ready = httpx.get(f"{url}/ready", timeout=5).status_code == 200
            except httpx.TransportError:
                time.sleep(0.1)
        logs = out.read_text() + err.read_text()
        assert ready, logs
        answer = httpx.post(
            f"{url}/v1/embeddings", json={"model": "d0", "input": "hello"}, timeout=10
        )
        assert answer.status_code == 200, answer.text
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
    folder = tmp_path / "hub" / "models--acme--tiny-bert" / "snapshots" / NEW
    lines = out.read_text().splitlines()
    assert lines[:2] == [
        f"sr: downloading {REPO} (revision main) ...",
        f"sr: downloaded {REPO} -> {folder}",
    ]
    assert TOKEN not in out.read_text() + err.read_text()
    assert hub.fetched() == SR_FILES  # once, by `sr serve`, not by its worker
    hub_requests = [s for s in hub.requests if s.server == "hub" and "/acme/" in s.path]
    assert all(s.headers.get("authorization") == f"Bearer {TOKEN}" for s in hub_requests)


@pytest.mark.e2e
def test_sr_serve_download_failure_end_to_end(start_hub, tiny_repo, tmp_path):
    hub = start_hub({REPO: tiny_repo}, token=TOKEN)
    path = tmp_path / "config.yaml"
    path.write_text("# mine\n" + config_text(managed("acme/missing")))
    before = path.read_bytes()
    done = subprocess.run(
        [sys.executable, "-m", "sr", "serve", "--download", "--config", str(path), "-dp", "2"],
        cwd=tmp_path, env=_sr_serve_env(hub, tmp_path), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stdout == "sr: downloading acme/missing (revision main) ...\n"
    assert done.stderr == (
        "sr serve: startup failed: cannot download acme/missing (revision main): repository"
        f" not found on {hub.url} (HTTP 404; a private or gated one needs HF_TOKEN with access)\n"
    )
    assert path.read_bytes() == before


# ---- (e) a LoRA adapter and its base -----------------------------------------------------


def test_an_adapter_and_then_its_base_are_fetched(start_hub, tiny_repo, hub_env, tmp_path):
    import peft

    from tests.models.test_lora_adapter import write_adapter

    source = tmp_path / "base"
    for name, content in tiny_repo.commits[NEW].items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(content)
    lora = peft.LoraConfig(task_type="FEATURE_EXTRACTION", r=2, lora_alpha=4,
                           target_modules=["query", "value"])  # fmt: skip
    adapter = write_adapter(source, tmp_path / "adapter", lora, head=False, base_name=REPO)
    files = read_folder(adapter) | {"README.md": b"# lora\n"}
    lora_commit = commit_id("tiny-bert-lora")
    hub = start_hub(
        {REPO: tiny_repo, "acme/tiny-lora": HubRepo({lora_commit: files}, {"main": lora_commit})}
    )
    out = io.StringIO()
    fetched = download_missing(parse_config(config_text(managed("acme/tiny-lora"))), out=out)
    assert list(fetched) == ["acme/tiny-lora (revision main)", f"{REPO} (revision main)"]
    # The adapter's two files (not its README) and the base's files sr reads.
    assert hub.fetched() == sorted([*SR_FILES, "adapter_config.json", "adapter_model.safetensors"])
    model = load_model(resolve_artifact("acme/tiny-lora"))
    assert model.adapter.base_dir == hub_env / "models--acme--tiny-bert" / "snapshots" / NEW
    assert model.embed(model.tokenize(["fetched twice"])).shape == (1, model.embedding_dim)
    assert download_missing(parse_config(config_text(managed("acme/tiny-lora"))), out=out) == {}
