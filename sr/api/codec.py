"""Bodies out and answers in for the typed helpers (sr.api.typed; the results: sr.api.results).

The rules:

- A helper sends the body an HTTP caller of the same route would send, so the worker
  validates it and its errors name the same fields (`input[1]: ...`). `model` is always
  the deployment's artifact, as the router front end sends it (sr.api.typed adds it).
- An error answer from a worker becomes the sr.errors class with its (status, code),
  carrying the worker's message and `param`; a pair sr does not know keeps the worker's
  status and code on a plain RequestError, so nothing is relabelled. The untyped `request`
  uses the same mapping.
- An answer that does not have the documented shape (an attached worker of another
  version, say) is WorkerFailed naming what was wrong, never a KeyError or TypeError.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeGuard, TypeVar

from sr.api.results import (
    Classification,
    Classifications,
    Decision,
    Decisions,
    Embeddings,
    Question,
    Reranking,
    RerankResult,
    Usage,
)
from sr.error_answer import read_error_answer
from sr.errors import (
    DeadlineExceeded,
    ForwardFailed,
    InvalidApiKey,
    InvalidRequest,
    MethodNotAllowed,
    ModelNotFound,
    NotFound,
    Overloaded,
    RequestError,
    RequestTooLarge,
    Unavailable,
    WorkerFailed,
)
from sr.http.jsonbody import dump_json, json_kind

T = TypeVar("T")

# -- request bodies -----------------------------------------------------------------


def embeddings_body(
    texts: str | Sequence[str],
    *,
    dimensions: int | None,
    truncate: bool | None,
    prompt_name: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"input": _texts(texts)}
    if dimensions is not None:
        body["dimensions"] = dimensions
    if prompt_name is not None:
        body["prompt_name"] = prompt_name  # one of the folder's prompts (the worker checks)
    return _with_truncate(body, truncate)


def classify_body(
    texts: str | Sequence[str], *, labels: Mapping[str, str] | None, truncate: bool | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"input": _texts(texts)}
    if labels is not None:
        body["labels"] = dict(labels)
    return _with_truncate(body, truncate)


def decisions_body(
    state: str, questions: Mapping[str, Question], *, truncate: bool | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"state": state, "questions": {}}
    for qid, question in questions.items():
        if not _is_question(question):  # an untyped caller's dict
            raise InvalidRequest(
                f"questions.{qid}: expected sr.Question, got {type(question).__name__}"
            )
        body["questions"][qid] = question.to_body()
    return _with_truncate(body, truncate)


def rerank_body(
    query: str, documents: Sequence[str], *, top_n: int | None, truncate: bool | None
) -> dict[str, Any]:
    if isinstance(documents, str):  # a str is a Sequence[str]; one document is a mistake
        raise InvalidRequest("documents: expected a list of strings, got a string")
    body: dict[str, Any] = {"query": query, "documents": list(documents)}
    if top_n is not None:
        body["top_n"] = top_n
    return _with_truncate(body, truncate)


def _is_question(value: object) -> bool:
    return isinstance(value, Question)


def encode_body(body: Mapping[str, Any]) -> bytes:
    """Compact JSON; a value JSON cannot carry (bytes, a set) is the caller's error."""
    try:
        return dump_json(body)
    except (TypeError, ValueError) as error:
        raise InvalidRequest(f"body: cannot be sent as JSON: {error}") from None


def _texts(texts: str | Sequence[str]) -> str | list[str]:
    # A str is itself a Sequence[str]: sent as one text, never as its characters.
    return texts if isinstance(texts, str) else list(texts)


def _with_truncate(body: dict[str, Any], truncate: bool | None) -> dict[str, Any]:
    if truncate is not None:
        body["truncate"] = truncate
    return body


# -- answers ------------------------------------------------------------------------


def parse_embeddings(answer: bytes, deployment: str, *, count: int) -> Embeddings:
    reader = _Reader(answer)

    def vector(item: dict[str, Any], index: int, where: str) -> tuple[float, ...]:
        values = reader.array(item, "embedding", where=f"{where}.")
        return tuple(reader.number(v, f"{where}.embedding") for v in values)

    return Embeddings(
        vectors=tuple(reader.rows_by_index("data", count, "embeddings", vector)),
        model=reader.text(reader.root, "model"),
        deployment=deployment,
        usage=reader.usage(),
    )


def parse_classifications(answer: bytes, deployment: str, *, count: int) -> Classifications:
    reader = _Reader(answer)

    def classification(item: dict[str, Any], index: int, where: str) -> Classification:
        return Classification(
            index=index,
            label=reader.text(item, "label", where=f"{where}."),
            probabilities=reader.probabilities(item, where),
        )

    return Classifications(
        results=tuple(reader.rows_by_index("results", count, "results", classification)),
        model=reader.text(reader.root, "model"),
        deployment=deployment,
        usage=reader.usage(),
    )


def parse_decisions(answer: bytes, deployment: str, *, question_ids: Sequence[str]) -> Decisions:
    reader = _Reader(answer)
    raw = reader.obj(reader.root.get("answers"), "answers")
    answers: dict[str, Decision] = {}
    for qid in question_ids:  # the request's order, whatever order the JSON had
        where = f"answers.{qid}"
        item = reader.obj(raw.get(qid), where)
        answers[qid] = Decision(
            type=reader.text(item, "type", where=f"{where}."),
            choice=reader.text(item, "choice", where=f"{where}."),
            probabilities=reader.probabilities(item, where),
            confidence=reader.number(item.get("confidence"), f"{where}.confidence"),
        )
    if len(raw) != len(answers):
        raise reader.malformed(f"answers: {sorted(set(raw) - set(answers))} were not asked")
    return Decisions(
        answers=answers,
        model=reader.text(reader.root, "model"),
        deployment=deployment,
        usage=reader.usage(),
    )


def parse_reranking(answer: bytes, deployment: str, *, documents: Sequence[str]) -> Reranking:
    reader = _Reader(answer)
    results: list[RerankResult] = []
    for position, row in enumerate(reader.array(reader.root, "results")):
        where = f"results[{position}]"
        item = reader.obj(row, where)
        index = reader.index(item, f"{where}.index", len(documents))
        score = reader.number(item.get("relevance_score"), f"{where}.relevance_score")
        # The text comes from the caller's own list: no need to ask the worker to echo it.
        results.append(RerankResult(index=index, score=score, document=documents[index]))
    return Reranking(
        results=tuple(results),
        model=reader.text(reader.root, "model"),
        deployment=deployment,
        usage=reader.usage(),
    )


class _Reader:
    """Typed reads from one worker answer; every shape error is WorkerFailed."""

    def __init__(self, answer: bytes) -> None:
        try:
            root = json.loads(answer)
        except (UnicodeDecodeError, ValueError, RecursionError) as error:
            raise self.malformed(f"not JSON ({error})") from None
        self.root: dict[str, Any] = self.obj(root, "answer")

    @staticmethod
    def malformed(detail: str) -> WorkerFailed:
        return WorkerFailed(f"malformed answer from the worker: {detail}")

    def obj(self, value: Any, where: str) -> dict[str, Any]:
        if not _is_json_object(value):
            raise self.malformed(f"{where}: expected an object, got {json_kind(value)}")
        return value

    def array(self, parent: dict[str, Any], key: str, *, where: str = "") -> list[Any]:
        value = parent.get(key)
        if not _is_json_array(value):
            raise self.malformed(f"{where}{key}: expected an array, got {json_kind(value)}")
        return value

    def text(self, parent: dict[str, Any], key: str, *, where: str = "") -> str:
        value = parent.get(key)
        if not isinstance(value, str):
            raise self.malformed(f"{where}{key}: expected a string, got {json_kind(value)}")
        return value

    def integer(self, value: Any, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.malformed(f"{where}: expected an integer, got {json_kind(value)}")
        return value

    def number(self, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.malformed(f"{where}: expected a number, got {json_kind(value)}")
        return float(value)

    def index(self, item: dict[str, Any], where: str, count: int) -> int:
        index = self.integer(item.get("index"), where)
        if not 0 <= index < count:
            raise self.malformed(f"{where}: {index} is outside [0, {count})")
        return index

    def rows_by_index(
        self, key: str, count: int, noun: str, read: Callable[[dict[str, Any], int, str], T]
    ) -> list[T]:
        """The array `key` of one row per input, each read by `read(item, index, where)` and
        put at its `index`: as many rows as inputs, every index once."""
        rows = self.array(self.root, key)
        if len(rows) != count:
            raise self.malformed(f"{key}: {len(rows)} {noun} for {count} inputs")
        placed: list[T | None] = [None] * count
        for position, row in enumerate(rows):
            where = f"{key}[{position}]"
            item = self.obj(row, where)
            index = self.index(item, f"{where}.index", count)
            placed[index] = read(item, index, where)
        done = [row for row in placed if row is not None]
        if len(done) != count:
            raise self.malformed(f"{key}: an index appears twice")
        return done

    def probabilities(self, item: dict[str, Any], where: str) -> dict[str, float]:
        raw = self.obj(item.get("probabilities"), f"{where}.probabilities")
        return {k: self.number(p, f"{where}.probabilities.{k}") for k, p in raw.items()}

    def usage(self) -> Usage:
        raw = self.obj(self.root.get("usage"), "usage")
        truncated: list[str] = []  # present only when something was cut
        if "truncated_inputs" in raw:
            for position, field in enumerate(self.array(raw, "truncated_inputs", where="usage.")):
                where = f"usage.truncated_inputs[{position}]"
                if not isinstance(field, str):
                    raise self.malformed(f"{where}: expected a string, got {json_kind(field)}")
                truncated.append(field)
        return Usage(
            prompt_tokens=self.integer(raw.get("prompt_tokens"), "usage.prompt_tokens"),
            total_tokens=self.integer(raw.get("total_tokens"), "usage.total_tokens"),
            truncated_inputs=tuple(truncated),
        )


# TypeGuards rather than bare isinstance: what JSON holds is typed Any (mypy) or
# Unknown (pyright) until read, and both checkers take these the same way.
def _is_json_object(value: object) -> TypeGuard[dict[str, Any]]:
    return isinstance(value, dict)


def _is_json_array(value: object) -> TypeGuard[list[Any]]:
    return isinstance(value, list)


# -- errors -------------------------------------------------------------------------

# The classes a worker's error answer can name, by (status, code): `code` alone is not
# enough (500 and 502 are both worker_failed), nor is the status (404 is not_found or
# model_not_found).
_WORKER_ERRORS: dict[tuple[int, str], type[RequestError]] = {
    (cls.status, cls.code): cls
    for cls in (
        InvalidRequest,
        InvalidApiKey,
        NotFound,
        ModelNotFound,
        MethodNotAllowed,
        RequestTooLarge,
        ForwardFailed,
        WorkerFailed,
        Overloaded,
        Unavailable,
        DeadlineExceeded,
    )
}


def error_from_answer(status: int, headers: Mapping[str, str], body: bytes) -> RequestError:
    """The sr.errors instance for a worker's error answer (status >= 400)."""
    answer = read_error_answer(body)
    code, message, param = answer.code, answer.message, answer.param
    cls = _WORKER_ERRORS.get((status, code or ""))
    if cls is Overloaded:
        return Overloaded(message, retry_after_s=_retry_after_s(headers))
    if cls is not None:
        return cls(message, param=param)
    error = RequestError(message, param=param)
    # Not an sr pair (an attached worker of another kind): keep its words, relabel nothing.
    error.status = status
    error.code = code or f"http_{status}"
    return error


def _retry_after_s(headers: Mapping[str, str]) -> int:
    for name, value in headers.items():
        if name.lower() == "retry-after":
            try:
                return max(1, int(value))
            except ValueError:
                break
    return 1
