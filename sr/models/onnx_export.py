"""`python -m sr.models.onnx_export FOLDER KEPT`: the child process that exports a model's
backbone for the onnxruntime engine (sr.models.onnx_engine.export_graph starts it).

It loads FOLDER (a resolved model folder, as load_model takes it) with the torch engine on
BLAS, exports, fuses and verifies its backbone into KEPT and prints the sidecar's JSON; a
model that cannot be served so exits 2 with one line on stderr. A child, because importing
onnxruntime starts a thread and a model's fork server must fork with one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sr.errors import UnsupportedModel
from sr.models.encoder import load_model
from sr.models.onnx_engine import export_verified


def main(argv: list[str]) -> int:
    folder, kept = argv
    try:
        model = load_model(Path(folder), kernel="blas")
        made = export_verified(model.backbone, Path(kept))
    except UnsupportedModel as error:
        print(f"sr.models.onnx_export: {error}", file=sys.stderr)
        return 2
    print(json.dumps(made))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
