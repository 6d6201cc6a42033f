"""sr.models: artifact resolution, BERT-family encoder in plain torch, pooling, heads.

from sr.models import load_model, resolve_artifact
model = load_model(resolve_artifact("sentence-transformers/all-MiniLM-L6-v2"))
vectors = model.embed(model.tokenize(["hello"]))
"""

from sr.models.artifacts import EMBEDDED_DEFAULT, resolve_artifact
from sr.models.checkpoint import UnsupportedModel
from sr.models.encoder import EncoderModel, load_model

__all__ = ["EMBEDDED_DEFAULT", "EncoderModel", "UnsupportedModel", "load_model", "resolve_artifact"]
