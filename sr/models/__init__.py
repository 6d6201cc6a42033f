"""sr.models: artifact resolution, BERT-family encoder in plain torch, pooling, heads.

from sr.models import load_model, resolve_artifact
model = load_model(resolve_artifact("sentence-transformers/all-MiniLM-L6-v2"))
vectors = model.embed(model.tokenize(["hello"]))
result = golden_check(model)          # worker startup
"""

from sr.errors import UnsupportedModel
from sr.models.artifacts import EMBEDDED_DEFAULT, resolve_artifact
from sr.models.encoder import EncoderModel, load_model
from sr.models.golden import GOLDEN_INPUTS, GoldenResult, golden_check

__all__ = [
    "EMBEDDED_DEFAULT",
    "GOLDEN_INPUTS",
    "EncoderModel",
    "GoldenResult",
    "UnsupportedModel",
    "golden_check",
    "load_model",
    "resolve_artifact",
]
