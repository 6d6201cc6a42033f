"""The OpenAPI document this router serves (GET /openapi.json): sr/router/openapi.yaml made
true to the live config and the deployments it serves, so that every request the document
allows is one the server accepts, and every one it refuses is outside the document.

What the shipped file cannot know and is settled here:
- security: bearer declared only when the listener has API keys; the fault route listed
  only when fault injection is on.
- which deployment: a request body's `model` is an enum of the deployments (name or
  artifact) able to serve that body; with several deployments it is required, but for a
  rerank body on TEI's routes when exactly one deployment can rerank (the router sends it
  there). A route
  with a body names its deployment there, so the `?model=` parameter (the same choice for
  clients that send no `model`) is described on GET /info only, where it is required with
  several deployments. A body no deployment can serve is left out (an operation whose
  every body is, with it).
- what each deployment holds a body to: token ids below its vocabulary size, `dimensions`
  up to its embedding size, `prompt_name` one of its folder's prompts. Deployments that
  differ are described as one variant each (`oneOf`, told apart by `model`).

A deployment with no ready replica yet is described as able to serve every body, with no
limits stated: its card (which says what its model serves) is not known until one is.
Built once per distinct combination.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterable
from importlib import resources
from typing import Any

import attrs

from sr.models.artifacts import resolve_artifact
from sr.models.json_file import read_json_object
from sr.router.faults import FAULTS_PATH
from sr.router.tei import POST_ROUTES as TEI_POST_ROUTES

INFO_PATH = "/info"
_MODEL_PARAMETER = "#/components/parameters/Model"
_SCHEMAS = "#/components/schemas/"

# What a deployment must serve for each request body: "any" (every model), "dense" (dense
# vectors: every model but a sparse encoder), "headless" (a dense model without a
# classification head: TEI's root route reads `inputs` as the text-classification task on
# one with a head), "sequence" (a text-classification head), "rerank" (such a head with one
# output), "token" (a token-classification head), "sparse" (a SPLADE model), "classify"
# (zero-shot labels on a dense model, the head's own labels on one with a head).
_NEEDS: dict[str, str] = {
    "EmbeddingsRequest": "dense",
    "SparseEmbeddingsRequest": "sparse",
    "ClassifyRequest": "classify",
    "DecisionsRequest": "dense",
    "RerankRequest": "rerank",
    "TokenizeRequest": "any",
    "TokenEmbeddingsRequest": "any",
    "DetokenizeRequest": "any",
    "TeiEmbedRequest": "dense",
    "TeiEmbedSparseRequest": "sparse",
    "TeiRerankRequest": "rerank",
    "TeiEmbedAllRequest": "any",
    "TeiDecodeRequest": "any",
    "TeiSimilarityRequest": "dense",
    "TeiPredictRequest": "sequence",
    "TextClassificationTask": "sequence",
    "TeiTokenizeRequest": "any",
    "TokenClassificationTask": "token",
}
_ROOT_NEEDS = {"TeiEmbedRequest": "headless"}
# /v1/classify's fields for one kind of head: zero-shot `labels` (required without a head of
# its own), entity grouping for a token-classification head only.
_CLASSIFY_FIELDS_REFUSED = {
    "headless": ("aggregation_strategy", "ignore_labels"),
    "sequence": ("aggregation_strategy", "ignore_labels"),
    "token": ("labels",),
}


@attrs.frozen
class ServedDeployment:
    """What the document says of one deployment. `serves` is None while its card is not
    known (no ready replica): it is then described as serving every body."""

    name: str
    artifact: str
    serves: frozenset[str] | None = None
    vocab_size: int | None = None
    embedding_dim: int | None = None
    prompt_names: tuple[str, ...] | None = None

    def can(self, need: str) -> bool:
        if self.serves is None:
            return True
        if need == "classify":
            return bool(self.serves & {"dense", "sequence", "token"})
        return need == "any" or need in self.serves

    @property
    def head(self) -> str | None:
        """ "headless", "sequence" or "token"; None while not known."""
        for kind in ("token", "sequence", "headless"):
            if kind in (self.serves or ()):
                return kind
        return None

    def limits(self, need: str) -> tuple:
        """What tells this deployment's variant of a body from another's."""
        head = self.head if need == "classify" else None
        return (self.vocab_size, self.embedding_dim, self.prompt_names, head)


def served_deployment(
    name: str, artifact: str, card: dict[str, Any] | None, vocab_size: int | None
) -> ServedDeployment:
    """A deployment as its worker card (None while no replica is ready) describes it."""
    if card is None:
        return ServedDeployment(name, artifact)
    serves = {"any"}
    head_task, labels = card.get("head_task"), card.get("head_labels") or []
    if head_task == "sequence":
        serves.add("sequence")
        if len(labels) == 1:
            serves.add("rerank")
    elif head_task == "token":
        serves.add("token")
    if card.get("sparse"):
        serves.add("sparse")
    else:
        serves.add("dense")
        if head_task is None:
            serves.add("headless")
    prompts = (card.get("prompts") or {}).get("texts")
    return ServedDeployment(
        name, artifact, frozenset(serves), vocab_size, card.get("embedding_dim"),
        tuple(sorted(prompts)) if prompts else None,
    )  # fmt: skip


@functools.lru_cache(maxsize=64)
def vocab_size(artifact: str, revision: str | None) -> int | None:
    """The vocabulary size in the artifact's config.json, when this process can find the
    folder (an attached worker's may be on another host); None otherwise."""
    try:
        folder = resolve_artifact(artifact, revision)
        size = read_json_object(folder / "config.json").get("vocab_size")
    except Exception:  # not found here, or no config.json: the limit goes unstated
        return None
    return size if isinstance(size, int) and size > 0 else None


def document_json(
    *, api_keys: bool, fault_injection: bool, deployments: tuple[ServedDeployment, ...]
) -> bytes:
    """The document for this listener and these deployments, as JSON."""
    return _document_json(api_keys, fault_injection, deployments)


@functools.cache
def _shipped() -> dict[str, Any]:
    import yaml

    text = resources.files("sr.router").joinpath("openapi.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


@functools.lru_cache(maxsize=64)
def _document_json(
    api_keys: bool, fault_injection: bool, deployments: tuple[ServedDeployment, ...]
) -> bytes:
    document = copy.deepcopy(_shipped())
    if not api_keys:
        document.pop("security", None)
        for operations in document["paths"].values():
            for operation in operations.values():
                operation.pop("security", None)
    if not fault_injection:
        del document["paths"][FAULTS_PATH]
    schemas = document["components"]["schemas"]
    several = len(deployments) > 1
    for path in list(document["paths"]):
        operations = document["paths"][path]
        for method in list(operations):
            operation = operations[method]
            if "requestBody" in operation:
                _drop_model_parameter(operation)
                if not _name_deployments(path, operation, schemas, deployments, several):
                    del operations[method]
            elif path == INFO_PATH:
                _require_model_parameter(operation, deployments, several)
        if not operations:
            del document["paths"][path]
    return json.dumps(document, separators=(",", ":")).encode()


def _drop_model_parameter(operation: dict[str, Any]) -> None:
    kept = [p for p in operation.get("parameters", []) if p.get("$ref") != _MODEL_PARAMETER]
    operation["parameters"] = kept


def _require_model_parameter(
    operation: dict[str, Any], deployments: tuple[ServedDeployment, ...], several: bool
) -> None:
    parameter = {
        "name": "model", "in": "query", "required": several,
        "description": "the deployment (name or artifact); default: the only one",
        "schema": {"type": "string", "enum": _names(deployments)},
    }  # fmt: skip
    rest = [p for p in operation.get("parameters", []) if p.get("$ref") != _MODEL_PARAMETER]
    operation["parameters"] = [*rest, parameter]


def _name_deployments(
    path: str,
    operation: dict[str, Any],
    schemas: dict[str, Any],
    deployments: tuple[ServedDeployment, ...],
    several: bool,
) -> bool:
    """The operation's body schema with each body's deployments named; False when no
    deployment serves any of its bodies."""
    content = operation["requestBody"]["content"]["application/json"]
    body = content["schema"]
    refs = [b.get("$ref", "") for b in body["oneOf"]] if "oneOf" in body else [body.get("$ref", "")]
    names = [ref.removeprefix(_SCHEMAS) for ref in refs]
    if not all(name in _NEEDS for name in names):
        return True  # a body that names no deployment (the fault route's)
    variants: list[dict[str, Any]] = []
    for name in names:
        need = (_ROOT_NEEDS.get(name) if path == "/" else None) or _NEEDS[name]
        serving = [d for d in deployments if d.can(need)]
        # A rerank body naming no deployment goes to the only cross-encoder, when every
        # card is known (sr.router.app's dispatch): there `model` may be left out.
        must_name = several and not (need == "rerank" and only_reranker(deployments))
        schema = _inlined(schemas[name], schemas)
        if path in TEI_POST_ROUTES and "model" in schema.get("required", ()):
            # TEI's routes take a native body (a peer's rerank body on /rerank) with the
            # deployment left to the URL or the rules above, as they take their own.
            schema = {**schema, "required": [f for f in schema["required"] if f != "model"]}
        variants += _variants(schema, need, serving, must_name)
    if not variants:
        return False
    content["schema"] = variants[0] if len(variants) == 1 else {"oneOf": variants}
    return True


def only_reranker(deployments: Iterable[ServedDeployment]) -> str | None:
    """The one deployment able to rerank, when every deployment's card is known and exactly
    one of them can; else None. The router sends a rerank body that names no deployment
    there (sr.router.app), and the document says so."""
    deployments = tuple(deployments)
    if any(d.serves is None for d in deployments):
        return None
    able = [d.name for d in deployments if d.can("rerank")]
    return able[0] if len(able) == 1 else None


def _variants(
    schema: dict[str, Any], need: str, serving: list[ServedDeployment], several: bool
) -> list[dict[str, Any]]:
    """One copy of `schema` per group of `serving` deployments that hold it to the same
    limits, its `model` naming them."""
    groups: dict[tuple, list[ServedDeployment]] = {}
    for deployment in serving:
        groups.setdefault(deployment.limits(need), []).append(deployment)
    return [_variant(schema, need, group, several) for group in groups.values()]


def _variant(
    schema: dict[str, Any], need: str, group: list[ServedDeployment], several: bool
) -> dict[str, Any]:
    variant = copy.deepcopy(schema)
    properties = variant.setdefault("properties", {})
    model = {"type": "string", "enum": _names(group)}
    required = variant.setdefault("required", [])
    if several and "model" not in required:
        required.append("model")
    if "model" not in required:
        model["nullable"] = True  # null is as absent: the only deployment
        model["enum"] = [*model["enum"], None]
    properties["model"] = model
    first = group[0]
    if first.vocab_size is not None:
        _bound_token_ids(variant, first.vocab_size - 1)
    if first.embedding_dim is not None and "dimensions" in properties:
        properties["dimensions"]["maximum"] = first.embedding_dim
    if first.prompt_names is not None:
        for holder in (properties, properties.get("parameters", {}).get("properties", {})):
            prompt = holder.get("prompt_name")
            if prompt is not None and "enum" not in prompt:
                prompt["enum"] = [*first.prompt_names, *([None] if prompt.get("nullable") else [])]
    if need == "classify" and first.head is not None:
        for field in _CLASSIFY_FIELDS_REFUSED[first.head]:
            properties.pop(field, None)
        if first.head == "headless":
            required.append("labels")  # zero-shot only: the model has no head of its own
    _null_in_enums(variant)
    return variant


def _null_in_enums(schema: Any) -> None:
    """OpenAPI 3.0's `nullable` beside an `enum`: null listed in the enum too, as JSON
    Schema validators (schemathesis's among them) otherwise refuse it."""
    if isinstance(schema, dict):
        enum = schema.get("enum")
        if schema.get("nullable") and isinstance(enum, list) and None not in enum:
            schema["enum"] = [*enum, None]
        for value in schema.values():
            _null_in_enums(value)
    elif isinstance(schema, list):
        for value in schema:
            _null_in_enums(value)


def _bound_token_ids(schema: Any, largest: int) -> None:
    """Every token id at most `largest`: in request bodies the integers with minimum 0 are
    token ids (counts and sizes start at 1)."""
    if isinstance(schema, dict):
        if schema.get("type") == "integer" and schema.get("minimum") == 0:
            schema["maximum"] = largest
        for value in schema.values():
            _bound_token_ids(value, largest)
    elif isinstance(schema, list):
        for value in schema:
            _bound_token_ids(value, largest)


def _inlined(schema: Any, schemas: dict[str, Any]) -> Any:
    """`schema` with every `$ref` to a component schema replaced by a copy of it, so a
    variant's limits apply inside it too."""
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith(_SCHEMAS):
            return _inlined(schemas[ref.removeprefix(_SCHEMAS)], schemas)
        return {key: _inlined(value, schemas) for key, value in schema.items()}
    if isinstance(schema, list):
        return [_inlined(value, schemas) for value in schema]
    return schema


def _names(deployments: Iterable[ServedDeployment]) -> list[str]:
    names: list[str] = []
    for deployment in deployments:
        for name in (deployment.name, deployment.artifact):
            if name not in names:
                names.append(name)
    return names
