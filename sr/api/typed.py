"""The typed Python API: `request` and the four typed helpers, over any `Dispatch`.

Rules (docs/python-api.md): a helper sends the body an HTTP caller of the same route would
send (sr.api.codec builds it), through the pool like any request, so the worker validates
it once and its errors name the same fields; the answer is read strictly into
sr.api.results' frozen classes, and a worker's error is raised as the sr.errors class of
its (status, code). The pool's Supervisor holds one `TypedApi` over itself and offers its
methods as its own (`router.embed`); this module knows the pool only through `Dispatch`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from sr.api import codec, results

Result = TypeVar("Result")


class Answer(Protocol):
    """A worker's answer as the pool hands it back (sr.pool.deployment.Reply)."""

    @property
    def status(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def body(self) -> bytes: ...


class Dispatch(Protocol):
    """What the typed API sends its requests through (sr.pool.supervisor.Supervisor)."""

    def resolve(self, model: str) -> str: ...
    def artifact_of(self, deployment: str) -> str: ...
    async def request_raw(
        self, deployment: str, path: str, body: bytes, *, timeout_s: float | None = None
    ) -> Answer: ...


class TypedApi:
    """`request` and the typed helpers, each one request through `dispatch`."""

    def __init__(self, dispatch: Dispatch) -> None:
        self._dispatch = dispatch

    async def request(
        self, model: str, path: str, payload: dict[str, Any], *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Any JSON route of the workers, untyped; the typed helpers below for the four."""
        dispatch = self._dispatch
        name = dispatch.resolve(model)
        body = dict(payload)
        body.setdefault("model", dispatch.artifact_of(name))
        encoded = json.dumps(body).encode()
        reply = await dispatch.request_raw(name, path, encoded, timeout_s=timeout_s)
        if reply.status >= 400:
            raise codec.error_from_answer(reply.status, reply.headers, reply.body)
        answer: dict[str, Any] = json.loads(reply.body)
        return answer

    async def embed(
        self,
        deployment: str,
        texts: str | Sequence[str],
        *,
        dimensions: int | None = None,
        truncate: bool | None = None,
        timeout_s: float | None = None,
        prompt_name: str | None = None,
    ) -> results.Embeddings:
        """One vector per text (/v1/embeddings); `dimensions` keeps the first ones;
        `prompt_name` puts one of the folder's prompts before each text (None: its
        default prompt, if any)."""
        body = codec.embeddings_body(
            texts, dimensions=dimensions, truncate=truncate, prompt_name=prompt_name
        )
        return await self._per_text(
            deployment, "/v1/embeddings", body, timeout_s, codec.parse_embeddings
        )

    async def classify(
        self,
        deployment: str,
        texts: str | Sequence[str],
        *,
        labels: Mapping[str, str] | None = None,
        truncate: bool | None = None,
        timeout_s: float | None = None,
    ) -> results.Classifications:
        """Label probabilities per text (/v1/classify): the model's own head, or zero-shot
        over `labels` (label -> description)."""
        body = codec.classify_body(texts, labels=labels, truncate=truncate)
        return await self._per_text(
            deployment, "/v1/classify", body, timeout_s, codec.parse_classifications
        )

    async def decide(
        self,
        deployment: str,
        state: str,
        questions: Mapping[str, results.Question],
        *,
        truncate: bool | None = None,
        timeout_s: float | None = None,
    ) -> results.Decisions:
        """The best criterion of each question for `state` (/v1/decisions)."""
        body = codec.decisions_body(state, questions, truncate=truncate)
        name, answer = await self._answer(deployment, "/v1/decisions", body, timeout_s)
        return codec.parse_decisions(answer, name, question_ids=list(body["questions"]))

    async def rerank(
        self,
        deployment: str,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int | None = None,
        truncate: bool | None = None,
        timeout_s: float | None = None,
    ) -> results.Reranking:
        """`documents` by relevance to `query`, best first (/v1/rerank, a cross-encoder)."""
        body = codec.rerank_body(query, documents, top_n=top_n, truncate=truncate)
        name, answer = await self._answer(deployment, "/v1/rerank", body, timeout_s)
        return codec.parse_reranking(answer, name, documents=body["documents"])

    async def _per_text(
        self,
        model: str,
        path: str,
        body: dict[str, Any],
        timeout_s: float | None,
        parse: Callable[..., Result],
    ) -> Result:
        """A route that answers one item per input text, read by `parse`, which checks
        that there are as many as the texts sent (one for a single string)."""
        name, answer = await self._answer(model, path, body, timeout_s)
        texts = body["input"]
        return parse(answer, name, count=1 if isinstance(texts, str) else len(texts))

    async def _answer(
        self, model: str, path: str, body: dict[str, Any], timeout_s: float | None
    ) -> tuple[str, bytes]:
        """(deployment, answer body) of a typed helper's request; errors raised."""
        dispatch = self._dispatch
        name = dispatch.resolve(model)
        payload = codec.encode_body({**body, "model": dispatch.artifact_of(name)})
        reply = await dispatch.request_raw(name, path, payload, timeout_s=timeout_s)
        if reply.status >= 400:
            raise codec.error_from_answer(reply.status, reply.headers, reply.body)
        return name, reply.body
