"""The typed Python API's results: what its helpers give back (docs/python-api.md).

`router.embed`, `router.classify`, `router.decide` and `router.rerank` (sr.api.typed, held
by sr.pool.supervisor.Supervisor) answer with these frozen attrs classes; sr.api.codec
builds the bodies and reads the workers' answers into them. The rules:

- Field names follow the wire (OpenAI / the native routes), sequences are tuples, and
  every result is in input order (rerank: best first, as the route answers).
- `model` is the artifact that answered (the worker's own word) and `deployment` the
  deployment the caller's name resolved to, so a caller that named either knows both.
- `Question` is the one request-side class: a /v1/decisions question, typed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

# The result classes; sr.api and sr re-export exactly these.
__all__ = [
    "Classification",
    "Classifications",
    "Decision",
    "Decisions",
    "Embeddings",
    "Question",
    "RerankResult",
    "Reranking",
    "Usage",
]


@attrs.frozen
class Usage:
    prompt_tokens: int
    total_tokens: int
    # The fields (`input[2]`, `documents[0]`) cut to the deployment's max_tokens.
    truncated_inputs: tuple[str, ...] = ()


@attrs.frozen
class Embeddings:
    vectors: tuple[tuple[float, ...], ...]  # one per input text, in input order
    model: str
    deployment: str
    usage: Usage


@attrs.frozen
class Classification:
    index: int
    label: str  # the most probable label
    probabilities: Mapping[str, float]  # every label, in the model's (or caller's) order


@attrs.frozen
class Classifications:
    results: tuple[Classification, ...]  # one per input text, in input order
    model: str
    deployment: str
    usage: Usage


@attrs.frozen
class Question:
    """A choice question of /v1/decisions: which criterion best describes the state."""

    criteria: Mapping[str, str]  # choice key -> description
    instructions: str | None = None  # put before the state when it is embedded

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"type": "choice", "criteria": dict(self.criteria)}
        if self.instructions is not None:
            body["instructions"] = self.instructions
        return body


@attrs.frozen
class Decision:
    type: str  # "choice", the only type today
    choice: str
    probabilities: Mapping[str, float]  # every criterion, in the question's order
    confidence: float  # the probability of `choice`


@attrs.frozen
class Decisions:
    answers: Mapping[str, Decision]  # by question id, in the request's order
    model: str
    deployment: str
    usage: Usage


@attrs.frozen
class RerankResult:
    index: int  # the document's position in the request
    score: float  # relevance in (0, 1): the sigmoid of the cross-encoder's logit
    document: str


@attrs.frozen
class Reranking:
    results: tuple[RerankResult, ...]  # best first; ties keep the documents' order
    model: str
    deployment: str
    usage: Usage
