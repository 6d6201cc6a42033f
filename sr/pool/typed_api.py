"""The typed Python API the Supervisor offers: `request` and the four typed helpers.

Rules (docs/python-api.md): a helper sends the body an HTTP caller of the same route would
send (sr.api_codec builds it), through the pool like any request, so the worker validates
it once and its errors name the same fields; the answer is read strictly into sr.api's
frozen classes, and a worker's error is raised as the sr.errors class of its (status, code).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sr import api, api_codec

if TYPE_CHECKING:
    from sr.pool.deployment import DeploymentPool, Reply


class TypedApi:
    """Mixed into sr.pool.supervisor.Supervisor, which provides what is declared here."""

    pools: dict[str, DeploymentPool]
    resolve: Callable[[str], str]
    request_raw: Callable[..., Awaitable[Reply]]

    async def request(
        self, model: str, path: str, payload: dict[str, Any], *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Any JSON route of the workers, untyped; the typed helpers below for the four."""
        name = self.resolve(model)
        body = dict(payload)
        body.setdefault("model", self.pools[name].config.artifact)
        reply = await self.request_raw(name, path, json.dumps(body).encode(), timeout_s=timeout_s)
        if reply.status >= 400:
            raise api_codec.error_from_answer(reply.status, reply.headers, reply.body)
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
    ) -> api.Embeddings:
        """One vector per text (/v1/embeddings); `dimensions` keeps the first ones."""
        body = api_codec.embeddings_body(texts, dimensions=dimensions, truncate=truncate)
        name, answer = await self._answer(deployment, "/v1/embeddings", body, timeout_s)
        count = 1 if isinstance(texts, str) else len(body["input"])
        return api_codec.parse_embeddings(answer, name, count=count)

    async def classify(
        self,
        deployment: str,
        texts: str | Sequence[str],
        *,
        labels: Mapping[str, str] | None = None,
        truncate: bool | None = None,
        timeout_s: float | None = None,
    ) -> api.Classifications:
        """Label probabilities per text (/v1/classify): the model's own head, or zero-shot
        over `labels` (label -> description)."""
        body = api_codec.classify_body(texts, labels=labels, truncate=truncate)
        name, answer = await self._answer(deployment, "/v1/classify", body, timeout_s)
        count = 1 if isinstance(texts, str) else len(body["input"])
        return api_codec.parse_classifications(answer, name, count=count)

    async def decide(
        self,
        deployment: str,
        state: str,
        questions: Mapping[str, api.Question],
        *,
        truncate: bool | None = None,
        timeout_s: float | None = None,
    ) -> api.Decisions:
        """The best criterion of each question for `state` (/v1/decisions)."""
        body = api_codec.decisions_body(state, questions, truncate=truncate)
        name, answer = await self._answer(deployment, "/v1/decisions", body, timeout_s)
        return api_codec.parse_decisions(answer, name, question_ids=list(body["questions"]))

    async def rerank(
        self,
        deployment: str,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int | None = None,
        truncate: bool | None = None,
        timeout_s: float | None = None,
    ) -> api.Reranking:
        """`documents` by relevance to `query`, best first (/v1/rerank, a cross-encoder)."""
        body = api_codec.rerank_body(query, documents, top_n=top_n, truncate=truncate)
        name, answer = await self._answer(deployment, "/v1/rerank", body, timeout_s)
        return api_codec.parse_reranking(answer, name, documents=body["documents"])

    async def _answer(
        self, model: str, path: str, body: dict[str, Any], timeout_s: float | None
    ) -> tuple[str, bytes]:
        """(deployment, answer body) of a typed helper's request; errors raised."""
        name = self.resolve(model)
        payload = api_codec.encode_body({**body, "model": self.pools[name].config.artifact})
        reply = await self.request_raw(name, path, payload, timeout_s=timeout_s)
        if reply.status >= 400:
            raise api_codec.error_from_answer(reply.status, reply.headers, reply.body)
        return name, reply.body
