"""Hugging Face text-embeddings-inference (TEI) routes over sr's native dispatch.

Pure translation, no I/O: a TEI request body becomes a native worker request (route and
body), the worker's native answer becomes TEI's answer, and errors take TEI's shape. The
router sends them through the same path as its native routes (sr.router.app `_native`:
deployment, cache, deadline header, hang-up cancel, replica header, metrics).

    POST /embed       -> /v1/embeddings   [[float, ...], ...]: always a list of vectors
    POST /embed_sparse -> /v1/sparse_embeddings  [[{index, value}, ...], ...]: a sparse
                         encoder's non-zero entries per input, indices ascending
    POST /rerank      -> /v1/rerank       TEI's body (`query`, `texts`): [{index, score,
                         text?}, ...], highest score first; Cohere's, Jina's, vLLM's and
                         Infinity's body (`query`, `documents`): the native answer
                         ({results: [{index, relevance_score, document?}], usage})
    POST /tokenize    -> /v1/tokenize     [[{id, text, special, start, stop}, ...], ...]
    POST /embed_all   -> /v1/token_embeddings  [[[float, ...] per token] per input]: the
                         last hidden states, special tokens included, before pooling
    POST /decode      -> /v1/detokenize   [text, ...]: `ids` (one list or several) back to
                         text, special tokens skipped unless skip_special_tokens is false
    POST /similarity, /predict           sr.router.tei_tasks
    POST /            -> by the body: `inputs` {source_sentence, sentences} is /similarity;
                         other `inputs` are /embed, or on a deployment with a head (its
                         card's `head_task`) Hugging Face's text- or token-classification
                         task (sr.router.tei_tasks); `query` with `texts` is /rerank
    GET  /info        -> TEI's info object (sr.router.tei_info)

Rules:
- Which deployment: the body's `model` (an sr extension), else the URL's (`/d/<name>/`,
  `?model=`), resolved like a native `model`; without either, the config's only deployment;
  with several, 422.
- TEI's defaults: normalize true, truncation_direction right, raw_scores and return_text
  false, add_special_tokens true. `truncate` absent or null leaves the deployment's
  `input.overflow` in force (TEI's `auto_truncate`, which /info reports).
  `truncation_direction: left` keeps a text's end (the native field of the same name).
- `normalize: false` is the vector before the checkpoint's Normalize module, as the model
  computes it (the native `normalize` field); `dimensions` keeps the first values, then
  normalises when asked (TEI's order).
- Token-id inputs are whole rows as TEI takes them (special tokens included, as /tokenize
  gives them): forwarded with the native `add_special_tokens: false`.
- `top_n` on TEI's /rerank body (litellm's huggingface provider sends it) keeps the best n.
- `prompt_name` on /embed, /embed_sparse, /embed_all and /similarity (`parameters`) is the
  native one (sr.worker.prompting): the folder's prompt before each text, as
  sentence-transformers' encode(prompt_name=...).
- Refused with 422, naming the field: a `prompt_name` on /tokenize (sr.router.tei_fields
  `refuse_prompt`), a batch mixing texts and token ids, and unknown fields (TEI ignores
  them; a misspelt `normalise` must not silently serve the default).
- /tokenize offsets are UTF-8 byte offsets into the input, as TEI's (Rust tokenizers) are;
  the worker answers code-point offsets and they are converted here. Token-classification
  offsets stay code points, as transformers' pipeline and the Inference API give them.
- Errors: `{"error": message, "error_type": TEI's type, "code": sr's code}` (plus
  `request_id`), with TEI's statuses: an empty batch or text 400 Empty; other validation
  422 Validation, 413 when inputs are too many or too large, or an input is over
  input.max_tokens and may not be cut (`truncate: false`); overloaded 429 Overloaded
  (Retry-After kept); no ready replica 503 Unhealthy; a worker failure 424 Backend; the
  deadline 504 Backend. A worker's own error names the native field (`input[2]`); it is
  renamed to TEI's (`inputs[2]`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import attrs

from sr.answer import JSON_CONTENT_TYPE, Answer
from sr.error_answer import read_error_answer
from sr.errors import EmptyInput, InvalidRequest, RequestError
from sr.http.jsonbody import dump_json, json_kind, parse_json_object
from sr.request_id import current as current_request_id
from sr.router import tei_tasks
from sr.router.tei_fields import (
    flag,
    is_int,
    prompt,
    refuse_prompt,
    text,
    texts,
    truncation,
)
from sr.router.tei_info import INFO_PATH as INFO_PATH
from sr.router.tei_tasks import (
    PREDICT,
    SIMILARITY,
    TEXT_CLASSIFICATION,
    TOKEN_CLASSIFICATION,
)
from sr.worker.timing import WorkerTiming
from sr.worker.validation import TOO_MANY_TOKENS, check_fields

EMBED, RERANK, TOKENIZE, ROOT = "/embed", "/rerank", "/tokenize", "/"
EMBED_ALL, DECODE, EMBED_SPARSE = "/embed_all", "/decode", "/embed_sparse"
POST_ROUTES = frozenset(
    {EMBED, RERANK, TOKENIZE, ROOT, SIMILARITY, PREDICT, EMBED_ALL, DECODE, EMBED_SPARSE}
)
# /rerank with Cohere's, Jina's, vLLM's or Infinity's body: the native /v1/rerank body.
PEER_RERANK = "peer-rerank"

_NATIVE_ROUTE = {
    EMBED: "/v1/embeddings",
    EMBED_SPARSE: "/v1/sparse_embeddings",
    RERANK: "/v1/rerank",
    PEER_RERANK: "/v1/rerank",
    TOKENIZE: "/v1/tokenize",
    EMBED_ALL: "/v1/token_embeddings",
    DECODE: "/v1/detokenize",
    **tei_tasks.NATIVE_ROUTE,
}
_FIELDS = {
    EMBED: frozenset(
        {
            "inputs", "normalize", "truncate", "truncation_direction", "prompt_name",
            "dimensions", "model",
        }
    ),
    RERANK: frozenset(
        {
            "query", "texts", "truncate", "truncation_direction", "raw_scores", "return_text",
            "top_n", "model",
        }
    ),
    TOKENIZE: frozenset({"inputs", "add_special_tokens", "prompt_name", "model"}),
    EMBED_ALL: frozenset({"inputs", "truncate", "truncation_direction", "prompt_name", "model"}),
    EMBED_SPARSE: frozenset({"inputs", "truncate", "truncation_direction", "prompt_name", "model"}),
    DECODE: frozenset({"ids", "skip_special_tokens", "model"}),
    **tei_tasks.FIELDS,
}  # fmt: skip
_REQUIRED = {
    EMBED: ("inputs",),
    EMBED_SPARSE: ("inputs",),
    RERANK: ("query", "texts"),
    TOKENIZE: ("inputs",),
    EMBED_ALL: ("inputs",),
    DECODE: ("ids",),
    SIMILARITY: ("inputs",),
    PREDICT: ("inputs",),
    TEXT_CLASSIFICATION: ("inputs",),
    TOKEN_CLASSIFICATION: ("inputs",),
}
# A worker's message starts with the native field; TEI's caller knows it by TEI's name.
_TEI_FIELD = {
    "/v1/embeddings": {"input": "inputs"},
    "/v1/sparse_embeddings": {"input": "inputs"},
    "/v1/rerank": {"documents": "texts", "return_documents": "return_text"},
    "/v1/tokenize": {"input": "inputs"},
    "/v1/token_embeddings": {"input": "inputs"},
    "/v1/classify": {
        "input": "inputs",
        "aggregation_strategy": "parameters.aggregation_strategy",
        "ignore_labels": "parameters.ignore_labels",
    },
}
_LEADING_FIELD = re.compile(r"^([A-Za-z_]+)(?=[\[.:\s])")
# sr code -> (TEI status, TEI error_type); anything else by its status class.
_BY_CODE = {
    "invalid_request": (422, "Validation"),
    "model_not_found": (422, "Validation"),
    "request_too_large": (413, "Validation"),
    "request_timeout": (408, "Validation"),
    "overloaded": (429, "Overloaded"),
    "unavailable": (503, "Unhealthy"),
    "worker_failed": (424, "Backend"),
    "internal_error": (424, "Backend"),
    "timeout": (504, "Backend"),
}


@attrs.frozen
class TeiRequest:
    """A TEI request as the native dispatch takes it: the worker route, the native body
    (with `model` when one is named), the `model` named, if any, the task it was read as
    and the caller's body (the task shapes some answers by it)."""

    route: str
    body: dict[str, Any]
    model: str | None
    task: str = EMBED
    caller: dict[str, Any] = attrs.field(factory=dict, eq=False)


# The head a deployment's model serves, by the body's `model` (None: the only deployment):
# "sequence", "token" or None (its card's `head_task`; None too while no replica is ready).
HeadTaskOf = Callable[[str | None], str | None]


@attrs.frozen
class TeiFront:
    """The TEI routes' side of sr.router.app's dispatch (see sr.router.front.Front)."""

    route: str  # the path called: /embed, /rerank, /tokenize, /similarity, /predict or /
    head_task: HeadTaskOf | None = None  # the root route reads the task off the deployment
    rewrites_answers = True

    def parse(self, raw: bytes, addressed: str | None = None) -> TeiRequest:
        return parse_request(self.route, raw, self.head_task, addressed)

    def forward(self, request: TeiRequest, raw: bytes) -> bytes:
        return dump_json(request.body)  # a body the router built: dumped once

    def answer(self, request: TeiRequest, payload: bytes) -> bytes:
        return tei_answer(request, payload)

    def worker_error(self, request: TeiRequest, status: int, payload: bytes) -> tuple[int, bytes]:
        return worker_error(request, status, payload)

    def error(self, error: RequestError) -> Answer:
        return error_reply(error)

    def timing_headers(self, timing: WorkerTiming) -> list[tuple[bytes, bytes]]:
        return timing.tei_headers()  # TEI's x-*-time, x-compute-tokens and -characters


# -- requests ------------------------------------------------------------------------------
def parse_request(
    path: str, raw: bytes, head_task: HeadTaskOf | None = None, addressed: str | None = None
) -> TeiRequest:
    """A TEI body for `path` as a native request; InvalidRequest (or EmptyInput) naming the
    field when it is not one TEI would take, or one sr cannot answer as TEI would."""
    body = parse_json_object(raw)
    if path == ROOT:
        path = _root_target(body, head_task, addressed)
    elif path == RERANK and "documents" in body and "texts" not in body:
        path = PEER_RERANK
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise InvalidRequest(f"model: expected a non-empty string, got {json_kind(model)}")
    if path == PEER_RERANK:  # the native body: the worker reads the peers' fields
        return TeiRequest(_NATIVE_ROUTE[path], body, model, path, body)
    check_fields(body, allowed=_FIELDS[path], required=_REQUIRED[path], route=path)
    native = _BODIES[path](body)
    if model is not None:
        native["model"] = model  # the worker checks it (sr.worker.served_as)
    return TeiRequest(_NATIVE_ROUTE[path], native, model, path, body)


def _root_target(body: dict[str, Any], head_task: HeadTaskOf | None, addressed: str | None) -> str:
    """TEI's root route takes the body of the model's task; sr reads the task off the body,
    and, for `inputs`, off the deployment: a head's task is Hugging Face's text or token
    classification, any other model's is /embed."""
    if "inputs" in body:
        if isinstance(body["inputs"], dict):
            return SIMILARITY
        model = body.get("model")
        named = model is None or (isinstance(model, str) and model)  # else refused later
        task = head_task(model if model is not None else addressed) if head_task and named else None
        if task == "token":
            return TOKEN_CLASSIFICATION
        if task == "sequence":
            return TEXT_CLASSIFICATION
        return EMBED
    if "query" in body and "texts" in body:
        return RERANK
    raise InvalidRequest(
        "body: POST / takes an embed body (`inputs`), a similarity body (`inputs` with "
        "`source_sentence` and `sentences`) or a rerank body (`query` and `texts`)"
    )


def _embed_body(body: dict[str, Any]) -> dict[str, Any]:
    native: dict[str, Any] = {"normalize": flag(body, "normalize", True)}
    native.update(truncation(body))
    native.update(prompt(body))
    inputs = body["inputs"]
    if isinstance(inputs, str):
        native["input"] = text(inputs, "inputs")
    elif isinstance(inputs, list):
        native["input"], ids = _embed_batch(inputs)
        if ids:
            native["add_special_tokens"] = False  # TEI embeds token ids as given
    else:
        raise InvalidRequest(
            f"inputs: expected a string, a list of token ids or a list of them, "
            f"got {json_kind(inputs)}"
        )
    dimensions = body.get("dimensions")
    if dimensions is not None:
        native["dimensions"] = dimensions  # the worker checks it against the model's size
    return native


def _embed_batch(inputs: list[Any]) -> tuple[list[Any], bool]:
    """TEI's list `inputs`: one text as token ids, or a batch of texts or of id lists.
    -> (native input, whether it is token ids)."""
    if not inputs:
        raise EmptyInput("inputs: must not be empty")
    if is_int(inputs[0]):  # one input, as token ids
        return inputs, True
    ids = isinstance(inputs[0], list)
    if not ids and not isinstance(inputs[0], str):
        raise InvalidRequest(
            f"inputs[0]: expected a string, a token id or a list of token ids, "
            f"got {json_kind(inputs[0])}"
        )
    kind = list if ids else str
    for index, item in enumerate(inputs):
        if not isinstance(item, kind):
            what = "a list of token ids" if ids else "a string"
            raise InvalidRequest(
                f"inputs[{index}]: expected {what} like inputs[0], got {json_kind(item)} "
                "(a batch is all texts or all token-id lists)"
            )
        if not item:
            raise EmptyInput(f"inputs[{index}]: must not be empty")
    return inputs, ids


def _rerank_body(body: dict[str, Any]) -> dict[str, Any]:
    items = body["texts"]
    if not isinstance(items, list):
        raise InvalidRequest(f"texts: expected a list of strings, got {json_kind(items)}")
    if not items:
        raise EmptyInput("texts: must not be empty")
    native: dict[str, Any] = {
        "query": text(body["query"], "query"),
        "documents": [text(item, f"texts[{i}]") for i, item in enumerate(items)],
        "raw_scores": flag(body, "raw_scores", False),
        "return_documents": flag(body, "return_text", False),
    }
    if body.get("top_n") is not None:
        native["top_n"] = body["top_n"]  # the worker checks it
    native.update(truncation(body))
    return native


def _tokenize_body(body: dict[str, Any]) -> dict[str, Any]:
    refuse_prompt(body)
    return {
        "input": texts(body["inputs"]),
        "add_special_tokens": flag(body, "add_special_tokens", True),
    }


def _embed_all_body(body: dict[str, Any]) -> dict[str, Any]:
    native: dict[str, Any] = {"input": texts(body["inputs"])}
    native.update(truncation(body))
    native.update(prompt(body))
    return native


def _embed_sparse_body(body: dict[str, Any]) -> dict[str, Any]:
    native: dict[str, Any] = {"input": texts(body["inputs"])}
    native.update(truncation(body))
    native.update(prompt(body))
    return native


def _decode_body(body: dict[str, Any]) -> dict[str, Any]:
    ids = body["ids"]
    if isinstance(ids, list) and not ids:
        raise EmptyInput("ids: must not be empty")
    # The worker checks the ids against the vocabulary, naming `ids[i]`.
    return {"ids": ids, "skip_special_tokens": flag(body, "skip_special_tokens", True)}


_BODIES: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    EMBED: _embed_body,
    EMBED_ALL: _embed_all_body,
    EMBED_SPARSE: _embed_sparse_body,
    DECODE: _decode_body,
    RERANK: _rerank_body,
    TOKENIZE: _tokenize_body,
    SIMILARITY: tei_tasks.similarity_body,
    PREDICT: tei_tasks.predict_body,
    TEXT_CLASSIFICATION: tei_tasks.text_classification_body,
    TOKEN_CLASSIFICATION: tei_tasks.token_classification_body,
}


# -- answers -------------------------------------------------------------------------------
def tei_answer(request: TeiRequest, payload: bytes) -> bytes:
    """The worker's native 2xx answer as TEI answers the same request."""
    task = request.task
    if task == PEER_RERANK:
        return payload  # the native answer is the shape Cohere's and Jina's clients read
    if task in tei_tasks.NATIVE_ROUTE:
        return tei_tasks.answer(task, request.body, request.caller, payload)
    if task == EMBED:
        return _raw_arrays(payload, "embedding", depth=1)
    if task == EMBED_ALL:
        return _raw_arrays(payload, "embeddings", depth=2)
    native = json.loads(payload)
    if task == EMBED_SPARSE:
        rows = sorted(native["data"], key=lambda row: row["index"])
        return dump_json([_sparse_entries(row) for row in rows])
    if task == DECODE:
        rows = sorted(native["data"], key=lambda row: row["index"])
        return dump_json([row["text"] for row in rows])
    if task == RERANK:
        ranks = []
        for result in native["results"]:  # already highest score first
            rank = {"index": result["index"], "score": result["relevance_score"]}
            if "document" in result:
                rank["text"] = result["document"]["text"]
            ranks.append(rank)
        return dump_json(ranks)
    items = request.body["input"]
    items = [items] if isinstance(items, str) else items
    rows = sorted(native["data"], key=lambda row: row["index"])
    return dump_json([_byte_offsets(items[row["index"]], row["tokens"]) for row in rows])


def _raw_arrays(payload: bytes, field: str, depth: int) -> bytes:
    """TEI's list of the native answer's vectors (`depth` 1) or per-token vectors (2), in
    index order, each number written as the worker wrote it. Read back as a float and
    written again, a number costs a repr (about 1 us): one MiniLM vector took 505 us of the
    router's event loop, 512 tokens' states 250 ms; kept as text, 115 us and 62 ms."""
    native = json.loads(payload, parse_float=str, parse_int=str, parse_constant=str)
    rows = sorted(native["data"], key=lambda row: int(row["index"]))

    def array(value: list[Any], level: int) -> str:
        if level == 1:
            return "[" + ",".join(value) + "]"
        return "[" + ",".join([array(item, level - 1) for item in value]) + "]"

    return array([row[field] for row in rows], depth + 1).encode()


def _sparse_entries(row: dict[str, Any]) -> list[dict[str, Any]]:
    pairs = zip(row["indices"], row["values"], strict=True)
    return [{"index": index, "value": value} for index, value in pairs]


def _byte_offsets(text: str, tokens: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Code-point offsets into `text` as UTF-8 byte offsets (TEI's)."""
    if text.isascii():
        return tokens
    starts = [0]
    for char in text:
        starts.append(starts[-1] + len(char.encode("utf-8", "surrogatepass")))
    for token in tokens:
        if token["start"] is not None:
            token["start"], token["stop"] = starts[token["start"]], starts[token["stop"]]
    return tokens


# -- errors --------------------------------------------------------------------------------
def error_reply(error: RequestError) -> Answer:
    """An sr error as TEI answers it: TEI's status and body, the error's own head fields."""
    if isinstance(error, EmptyInput):
        status, error_type = 400, "Empty"
    else:
        status, error_type = _status_and_type(error.code, error.status)
    body = _error_body(error.message, error_type, error.code)
    return status, [JSON_CONTENT_TYPE, *error.header_fields()], body


def worker_error(request: TeiRequest, status: int, payload: bytes) -> tuple[int, bytes]:
    """A worker's non-2xx native answer in TEI's shape, its field renamed to TEI's."""
    details = read_error_answer(payload)
    code, message = details.code or "worker_failed", details.message
    if request.task != PEER_RERANK:  # a peer's body has the native field names
        renames = _TEI_FIELD.get(request.route, {})
        message = _LEADING_FIELD.sub(
            lambda m: renames.get(m.group(1), m.group(1)), message, count=1
        )
    tei_status, error_type = _status_and_type(code, status)
    if code == "invalid_request" and TOO_MANY_TOKENS in message:
        tei_status = 413  # TEI's answer to an input over the limit that may not be cut
    return tei_status, _error_body(message, error_type, code)


def _status_and_type(code: str, status: int) -> tuple[int, str]:
    known = _BY_CODE.get(code)
    if known is not None:
        return known
    return (424, "Backend") if status >= 500 else (status, "Validation")


def _error_body(message: str, error_type: str, code: str) -> bytes:
    body = {"error": message, "error_type": error_type, "code": code}
    request_id = current_request_id.get()
    if request_id is not None:
        body["request_id"] = request_id
    return dump_json(body)
