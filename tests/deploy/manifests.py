"""deploy/k8s rendered the way an operator renders it: `kubectl kustomize OVERLAY`.

Rules:
- every directory under deploy/k8s/<mode>/ with a kustomization.yaml, except `base`, is an
  overlay an operator applies; each is rendered once per test session (`rendered`);
- kubectl is found on PATH; without it, or with a kustomize older than the manifests need
  (the `labels` field came in kustomize v4.1), tests skip and say why;
- lookups (`one`, `containers`, `env_value`, ...) fail loudly: a missing object is a bug
  of the manifests, never a silent pass.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
MIN_KUSTOMIZE = (4, 1)  # the `labels` field
RENDER_TIMEOUT_S = 60

Doc = dict[str, Any]


def overlays() -> list[str]:
    """`mode/overlay` for every overlay directory, sorted (stable test ids)."""
    found = [
        path.parent.relative_to(K8S).as_posix()
        for path in K8S.glob("*/*/kustomization.yaml")
        if path.parent.name != "base"
    ]
    return sorted(found)


@functools.cache
def _kubectl() -> tuple[str | None, str]:
    """(path to kubectl, or None) and why it cannot be used."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return None, "kubectl is not installed (.ci/run installs it best-effort)"
    out = subprocess.run(
        [kubectl, "version", "--client", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=RENDER_TIMEOUT_S,
        check=False,
    )
    try:
        version = json.loads(out.stdout).get("kustomizeVersion", "")
    except json.JSONDecodeError:
        version = ""
    match = re.match(r"v(\d+)\.(\d+)", version)
    if match is None or (int(match[1]), int(match[2])) < MIN_KUSTOMIZE:
        return None, f"kubectl has no kustomize v4.1 or newer (it reports {version or 'none'})"
    return kubectl, ""


def require_kubectl() -> str:
    kubectl, why = _kubectl()
    if kubectl is None:
        pytest.skip(f"deploy/k8s not rendered: {why}")
    return kubectl


@functools.cache
def _render(overlay: str) -> tuple[Doc, ...]:
    kubectl = require_kubectl()
    out = subprocess.run(
        [kubectl, "kustomize", str(K8S / overlay)],
        capture_output=True,
        text=True,
        timeout=RENDER_TIMEOUT_S,
        check=False,
    )
    assert out.returncode == 0, f"kubectl kustomize {overlay} failed:\n{out.stderr}"
    assert not out.stderr.strip(), f"kubectl kustomize {overlay} warned:\n{out.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(out.stdout) if doc)


def rendered(overlay: str) -> list[Doc]:
    """The objects `kubectl kustomize deploy/k8s/<overlay>` prints (a fresh list)."""
    return list(_render(overlay))


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    """The one object of `kind` (whose name starts with `name`: generated names carry a
    hash suffix)."""
    found = [
        d
        for d in docs
        if d["kind"] == kind and (name is None or d["metadata"]["name"].startswith(name))
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def workloads(docs: list[Doc]) -> list[Doc]:
    return [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]


def pod_spec(workload: Doc) -> Doc:
    return workload["spec"]["template"]["spec"]


def containers(workload: Doc, *, init: bool = True) -> list[Doc]:
    spec = pod_spec(workload)
    return [*(spec.get("initContainers", []) if init else []), *spec["containers"]]


def main_container(workload: Doc) -> Doc:
    (container,) = pod_spec(workload)["containers"]
    return container


def env_entry(container: Doc, name: str) -> Doc:
    found = [e for e in container.get("env", []) if e["name"] == name]
    assert len(found) == 1, f"container {container['name']}: expected one env {name}"
    return found[0]


def env_value(container: Doc, name: str) -> str:
    return env_entry(container, name)["value"]


def configmap_file(docs: list[Doc], volume_name: str, workload: Doc) -> tuple[str, str]:
    """(file name, text) of the one file in the ConfigMap mounted as `volume_name`."""
    (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == volume_name]
    name = volume["configMap"]["name"]
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name]
    ((filename, text),) = cm["data"].items()
    return filename, text


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def prestop_sleep_s(container: Doc) -> float:
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep" and len(command) == 2, command
    return float(command[1])


def probe_budget_s(probe: Doc) -> float:
    """How long a probe may keep failing before the kubelet acts (defaults: k8s API)."""
    return probe.get("initialDelaySeconds", 0) + probe.get("periodSeconds", 10) * probe.get(
        "failureThreshold", 3
    )
