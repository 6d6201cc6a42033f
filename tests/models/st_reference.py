"""sentence-transformers as the reference for prompts and sparse encoders, run in a child
process: importing it here would leave it in sys.modules for later tests (test_artifacts
checks that sr never imports it). A test dependency (the test extra).

`save_sparse_encoder(mlm_folder, out_folder, ...)` wraps a transformers masked-LM folder in
a SparseEncoder (MLMTransformer -> SpladePooling) and saves it as sentence-transformers
does; `encode(folder, calls, sparse=...)` runs `encode(texts, prompt_name=...)` for each call
and returns the dense float32 answers.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import torch

_SAVE_SPARSE = """
import json, sys
from sentence_transformers import SparseEncoder
from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling
mlm, out, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
pooling = SpladePooling(options["pooling"], activation_function=options["activation"])
model = SparseEncoder(
    modules=[MLMTransformer(mlm), pooling], max_active_dims=options.get("max_active_dims"),
    prompts=options.get("prompts"), default_prompt_name=options.get("default_prompt_name"),
)
model.save(out)
"""

_ENCODE = """
import json, sys, torch
import sentence_transformers as st
folder, out, sparse, calls = sys.argv[1], sys.argv[2], sys.argv[3] == "1", json.loads(sys.argv[4])
kind = st.SparseEncoder if sparse else st.SentenceTransformer
model = kind(folder, device="cpu")
answers = []
for call in calls:
    got = model.encode(call["texts"], prompt_name=call.get("prompt_name"), convert_to_tensor=True)
    answers.append((got.to_dense() if got.is_sparse else got).float())
torch.save(answers, out)
"""


def _run(script: str, *args: str) -> None:
    assert importlib.util.find_spec("sentence_transformers") is not None, (
        "sentence-transformers is not installed (pip install -e '.[test]')"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def save_sparse_encoder(mlm_folder: Path, out: Path, **options) -> Path:
    """options: pooling ("max"/"sum"), activation ("relu"/"log1p_relu"), max_active_dims,
    prompts, default_prompt_name."""
    _run(_SAVE_SPARSE, str(mlm_folder), str(out), json.dumps(options))
    return out


def encode(folder: Path, calls: list[dict], *, sparse: bool, work: Path) -> list[torch.Tensor]:
    """sentence-transformers' encode(texts, prompt_name=...) for each call
    ({"texts": [...], "prompt_name": name or absent})."""
    out = work / "st-answers.pt"
    _run(_ENCODE, str(folder), str(out), "1" if sparse else "0", json.dumps(calls))
    return torch.load(out)
