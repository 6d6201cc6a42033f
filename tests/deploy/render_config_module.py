"""deploy/k8s/common/render_config.py, imported by path (it ships in a ConfigMap, not in sr)."""

from __future__ import annotations

import importlib.util

from tests.deploy.manifests import K8S

SCRIPT = K8S / "common" / "render_config.py"

_spec = importlib.util.spec_from_file_location("render_config", SCRIPT)
assert _spec is not None and _spec.loader is not None
render_config = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render_config)
