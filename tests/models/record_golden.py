"""Record sr/models/golden_minilm.json with sentence-transformers (a dev tool, not a test).

    python -m tests.models.record_golden

Needs sentence-transformers (pip install '.[bench]'); sr never imports it at run time.
Each input is encoded alone (batch_size=1) so no padding enters the reference.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from sr.models.artifacts import EMBEDDED_DEFAULT, resolve_artifact
from sr.models.golden import GOLDEN_INPUTS, REFERENCE_FILES


def main() -> None:
    import sentence_transformers

    torch.set_num_threads(1)
    folder = resolve_artifact(EMBEDDED_DEFAULT)
    st = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    vectors = st.encode(list(GOLDEN_INPUTS), batch_size=1, convert_to_numpy=True)
    sha = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    reference = {
        "artifact": EMBEDDED_DEFAULT,
        "weights_sha256": sha,
        "produced_by": f"sentence-transformers {sentence_transformers.__version__}, "
        f"torch {torch.__version__}, 1 thread, batch_size=1",
        "max_seq_length": st.max_seq_length,
        "inputs": list(GOLDEN_INPUTS),
        "embeddings": [[float(x) for x in row] for row in vectors],
    }
    target = Path(REFERENCE_FILES[0])
    target.write_text(json.dumps(reference, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {target} ({len(vectors)} x {len(vectors[0])})")


if __name__ == "__main__":
    main()
