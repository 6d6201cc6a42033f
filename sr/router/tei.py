"""Hugging Face text-embeddings-inference (TEI) routes over sr's native dispatch.

Pure translation, no I/O: a TEI request body becomes a native worker request (route and
body), the worker's native answer becomes TEI's answer, and errors take TEI's shape. The
router sends them through the same path as its native routes (sr.router.app `_native`:
deployment, cache, deadline header, hang-up cancel, replica header, metrics).

    POST /embed     -> /v1/embeddings   [[float, ...], ...]: always a list of vectors
    POST /rerank    -> /v1/rerank       [{index, score, text?}, ...], highest score first
    POST /tokenize  -> /v1/tokenize     [[{id, text, special, start, stop}, ...], ...]
    POST /          -> /embed for a body with `inputs`, /rerank for `query` and `texts`;
                       on a token-classification deployment (its card's `head_task`),
                       Hugging Face's token-classification task: `{inputs, parameters?}`
                       -> /v1/classify, answered [{entity_group, score, word, start, end}]
                       (a list of such lists for a list of inputs)
    GET  /info      -> TEI's info object, from a ready replica's worker card (`info`)

Rules:
- Which deployment: the body's `model` (an sr extension; for GET /info `?model=`), resolved
  like a native `model`; without one, the config's only deployment; with several, 422.
- TEI's defaults: normalize true, truncation_direction right, raw_scores and return_text
  false, add_special_tokens true. `truncate` absent or null leaves the deployment's
  `input.overflow` in force (TEI's `auto_truncate`, which /info reports).
- `normalize: false` is the vector before the checkpoint's Normalize module, as the model
  computes it (the native `normalize` field); `dimensions` keeps the first values, then
  normalises when asked (TEI's order).
- Token-id inputs are whole rows as TEI takes them (special tokens included, as /tokenize
  gives them): forwarded with the native `add_special_tokens: false`.
- Refused with 422, naming the field: truncation_direction `left` (sr cuts from the right),
  a `prompt_name` (sr applies no sentence-transformers prompts), a batch mixing texts and
  token ids, and unknown fields (TEI ignores them; a misspelt `normalise` must not
  silently serve the default).
- /tokenize offsets are UTF-8 byte offsets into the input, as TEI's (Rust tokenizers) are;
  the worker answers code-point offsets and they are converted here. Token-classification
  offsets stay code points, as transformers' pipeline and the Inference API give them.
- The token-classification `parameters` are the task's: `aggregation_strategy` and
  `ignore_labels` (the native fields); `stride` is refused unless null (sr does not
  split a text into overlapping windows: a long text follows `input.overflow`).
- Errors: `{"error": message, "error_type": TEI's type, "code": sr's code}` (plus
  `request_id`), with TEI's statuses: an empty batch or text 400 Empty; other validation
  422 Validation, 413 when inputs are too many or too large; overloaded 429 Overloaded
  (Retry-After kept); no ready replica 503 Unhealthy; a worker failure 424 Backend; the
  deadline 504 Backend. A worker's own error names the native field (`input[2]`); it is
  renamed to TEI's (`inputs[2]`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

import attrs

from sr.answer import JSON_CONTENT_TYPE, Answer
from sr.error_answer import read_error_answer
from sr.errors import EmptyInput, InvalidRequest, RequestError
from sr.http.jsonbody import dump_json, json_kind, parse_json_object
from sr.pool.policy import MAX_INFLIGHT
from sr.request_id import current as current_request_id
from sr.worker.timing import WorkerTiming
from sr.worker.validation import MAX_INPUTS

EMBED, RERANK, TOKENIZE, ROOT = "/embed", "/rerank", "/tokenize", "/"
POST_ROUTES = frozenset({EMBED, RERANK, TOKENIZE, ROOT})
INFO_PATH = "/info"
# Hugging Face's token-classification task, reached through the root route only.
TOKEN_CLASSIFICATION = "token-classification"
_TOKEN_PARAMETERS = frozenset({"aggregation_strategy", "ignore_labels", "stride"})

_NATIVE_ROUTE = {
    EMBED: "/v1/embeddings",
    RERANK: "/v1/rerank",
    TOKENIZE: "/v1/tokenize",
    TOKEN_CLASSIFICATION: "/v1/classify",
}
_FIELDS = {
    EMBED: frozenset(
        {
            "inputs", "normalize", "truncate", "truncation_direction", "prompt_name",
            "dimensions", "model",
        }
    ),
    RERANK: frozenset(
        {"query", "texts", "truncate", "truncation_direction", "raw_scores", "return_text", "model"}
    ),
    TOKENIZE: frozenset({"inputs", "add_special_tokens", "prompt_name", "model"}),
    TOKEN_CLASSIFICATION: frozenset({"inputs", "parameters", "model"}),
}  # fmt: skip
_REQUIRED = {
    EMBED: ("inputs",),
    RERANK: ("query", "texts"),
    TOKENIZE: ("inputs",),
    TOKEN_CLASSIFICATION: ("inputs",),
}
# A worker's message starts with the native field; TEI's caller knows it by TEI's name.
_TEI_FIELD = {
    "/v1/embeddings": {"input": "inputs"},
    "/v1/rerank": {"documents": "texts", "return_documents": "return_text"},
    "/v1/tokenize": {"input": "inputs"},
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
_POOLING_NAMES = {"lasttoken": "last_token"}  # TEI's spelling of sentence-transformers' modes


@attrs.frozen
class TeiRequest:
    """A TEI request as the native dispatch takes it: the worker route, the native body
    (with `model` when one is named) and the `model` named, if any."""

    route: str
    body: dict[str, Any]
    model: str | None


# The head a deployment's model serves, by the body's `model` (None: the only deployment):
# "sequence", "token" or None (its card's `head_task`; None too while no replica is ready).
HeadTaskOf = Callable[[str | None], str | None]


@attrs.frozen
class TeiFront:
    """The TEI routes' side of sr.router.app's dispatch (see sr.router.front.Front)."""

    route: str  # the path called: /embed, /rerank, /tokenize or /
    head_task: HeadTaskOf | None = None  # the root route reads the task off the deployment

    def parse(self, raw: bytes) -> TeiRequest:
        return parse_request(self.route, raw, self.head_task)

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
def parse_request(path: str, raw: bytes, head_task: HeadTaskOf | None = None) -> TeiRequest:
    """A TEI body for `path` as a native request; InvalidRequest (or EmptyInput) naming the
    field when it is not one TEI would take, or one sr cannot answer as TEI would."""
    body = parse_json_object(raw)
    if path == ROOT:
        path = _root_target(body, head_task)
    _check_fields(body, path)
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise InvalidRequest(f"model: expected a non-empty string, got {json_kind(model)}")
    if path == EMBED:
        native = _embed_body(body)
    elif path == RERANK:
        native = _rerank_body(body)
    elif path == TOKEN_CLASSIFICATION:
        native = _token_classification_body(body)
    else:
        native = _tokenize_body(body)
    if model is not None:
        native["model"] = model  # the worker checks it (sr.worker.served_as)
    return TeiRequest(_NATIVE_ROUTE[path], native, model)


def _root_target(body: dict[str, Any], head_task: HeadTaskOf | None) -> str:
    """TEI's root route takes the body of the model's task; sr reads the task off the body,
    and, for `inputs`, off the deployment: a token-classification head's task is Hugging
    Face's token classification, any other model's is /embed."""
    if "inputs" in body:
        model = body.get("model")
        named = model is None or (isinstance(model, str) and model)  # else refused later
        if head_task is not None and named and head_task(model) == "token":
            return TOKEN_CLASSIFICATION
        return EMBED
    if "query" in body and "texts" in body:
        return RERANK
    raise InvalidRequest(
        "body: POST / takes an embed body (`inputs`) or a rerank body (`query` and `texts`)"
    )


def _check_fields(body: dict[str, Any], path: str) -> None:
    allowed = _FIELDS[path]
    for name in body:
        if name not in allowed:
            raise InvalidRequest(
                f"{name}: unknown field for {path}; allowed: {', '.join(sorted(allowed))}"
            )
    for name in _REQUIRED[path]:
        if name not in body:
            raise InvalidRequest(f"{name}: required field is missing")


def _embed_body(body: dict[str, Any]) -> dict[str, Any]:
    _refuse_prompt(body)
    native: dict[str, Any] = {"normalize": _flag(body, "normalize", True)}
    native.update(_truncation(body))
    inputs = body["inputs"]
    if isinstance(inputs, str):
        native["input"] = _text(inputs, "inputs")
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
    if _is_int(inputs[0]):  # one input, as token ids
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
    texts = body["texts"]
    if not isinstance(texts, list):
        raise InvalidRequest(f"texts: expected a list of strings, got {json_kind(texts)}")
    if not texts:
        raise EmptyInput("texts: must not be empty")
    native: dict[str, Any] = {
        "query": _text(body["query"], "query"),
        "documents": [_text(text, f"texts[{i}]") for i, text in enumerate(texts)],
        "raw_scores": _flag(body, "raw_scores", False),
        "return_documents": _flag(body, "return_text", False),
    }
    native.update(_truncation(body))
    return native


def _tokenize_body(body: dict[str, Any]) -> dict[str, Any]:
    _refuse_prompt(body)
    texts = _texts(body["inputs"])
    return {"input": texts, "add_special_tokens": _flag(body, "add_special_tokens", True)}


def _texts(inputs: Any) -> str | list[str]:
    """`inputs` as one text or a non-empty list of texts."""
    if isinstance(inputs, str):
        return _text(inputs, "inputs")
    if isinstance(inputs, list):
        if not inputs:
            raise EmptyInput("inputs: must not be empty")
        return [_text(text, f"inputs[{i}]") for i, text in enumerate(inputs)]
    raise InvalidRequest(f"inputs: expected a string or a list of strings, got {json_kind(inputs)}")


def _token_classification_body(body: dict[str, Any]) -> dict[str, Any]:
    """Hugging Face's token-classification task body as the native /v1/classify's."""
    native: dict[str, Any] = {"input": _texts(body["inputs"])}
    parameters = body.get("parameters")
    if parameters is None:
        return native
    if not isinstance(parameters, dict):
        raise InvalidRequest(f"parameters: expected an object, got {json_kind(parameters)}")
    for name, value in parameters.items():
        if name not in _TOKEN_PARAMETERS:
            allowed = ", ".join(sorted(_TOKEN_PARAMETERS))
            raise InvalidRequest(f"parameters.{name}: unknown parameter; allowed: {allowed}")
        if name == "stride":
            if value is not None:
                raise InvalidRequest(
                    "parameters.stride: not supported; sr classifies each text in one window "
                    "(a text over input.max_tokens follows the deployment's input.overflow)"
                )
        elif value is not None:
            native[name] = value  # the worker checks them, naming the native field
    return native


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"{field}: expected a string, got {json_kind(value)}")
    if not value:
        raise EmptyInput(f"{field}: must not be empty")
    return value  # the worker checks the rest (length, lone surrogates)


def _flag(body: dict[str, Any], field: str, default: bool) -> bool:
    value = body.get(field, default)
    if not isinstance(value, bool):
        raise InvalidRequest(f"{field}: expected true or false, got {json_kind(value)}")
    return value


def _truncation(body: dict[str, Any]) -> dict[str, Any]:
    """The native `truncate` (absent: the deployment's input.overflow), after checking that
    the direction is one sr can cut in."""
    direction = body.get("truncation_direction")
    if direction in ("left", "Left"):
        raise InvalidRequest(
            "truncation_direction: 'left' is not supported; sr cuts inputs from the right "
            "(keeping their start)"
        )
    if direction not in (None, "right", "Right"):
        raise InvalidRequest(f"truncation_direction: expected 'right' or 'left', got {direction!r}")
    truncate = body.get("truncate")
    if truncate is None:
        return {}
    if not isinstance(truncate, bool):
        raise InvalidRequest(f"truncate: expected true, false or null, got {json_kind(truncate)}")
    return {"truncate": truncate}


def _refuse_prompt(body: dict[str, Any]) -> None:
    if body.get("prompt_name") is not None:
        raise InvalidRequest(
            "prompt_name: not supported; sr embeds each text as sent (it applies no "
            "sentence-transformers prompts): put the prompt in the text"
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# -- answers -------------------------------------------------------------------------------
def tei_answer(request: TeiRequest, payload: bytes) -> bytes:
    """The worker's native 2xx answer as TEI answers the same request."""
    native = json.loads(payload)
    if request.route == "/v1/embeddings":
        rows = sorted(native["data"], key=lambda row: row["index"])
        return dump_json([row["embedding"] for row in rows])
    if request.route == "/v1/classify":  # token classification
        results = sorted(native["results"], key=lambda result: result["index"])
        if isinstance(request.body["input"], str):
            return dump_json(results[0]["entities"])
        return dump_json([result["entities"] for result in results])
    if request.route == "/v1/rerank":
        ranks = []
        for result in native["results"]:  # already highest score first
            rank = {"index": result["index"], "score": result["relevance_score"]}
            if "document" in result:
                rank["text"] = result["document"]["text"]
            ranks.append(rank)
        return dump_json(ranks)
    texts = request.body["input"]
    texts = [texts] if isinstance(texts, str) else texts
    rows = sorted(native["data"], key=lambda row: row["index"])
    return dump_json([_byte_offsets(texts[row["index"]], row["tokens"]) for row in rows])


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
    renames = _TEI_FIELD.get(request.route, {})
    message = _LEADING_FIELD.sub(lambda m: renames.get(m.group(1), m.group(1)), message, count=1)
    tei_status, error_type = _status_and_type(code, status)
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


# -- GET /info -----------------------------------------------------------------------------
def info_model(query_string: bytes) -> str | None:
    """`?model=` of GET /info (an sr extension, as `model` in a body), or None."""
    values = parse_qs(query_string.decode("latin-1")).get("model")
    if not values:
        return None
    if len(values) > 1:
        raise InvalidRequest("model: give the query parameter once")
    return values[0]


def info(
    card: dict[str, Any], *, deployment: str, ready_replicas: int, version: str
) -> dict[str, Any]:
    """TEI's info object for one deployment, from a ready replica's worker card."""
    limits = card.get("limits") or {}
    return {
        "model_id": card.get("artifact") or card.get("id"),
        "model_sha": card.get("revision"),
        "model_dtype": card.get("dtype"),
        "served_model_name": deployment,
        "model_type": _model_type(card),
        # Requests each replica admits at once, times the ready replicas.
        "max_concurrent_requests": MAX_INFLIGHT * ready_replicas,
        "max_input_length": limits.get("max_input_tokens"),
        "max_batch_tokens": limits.get("max_num_batched_tokens"),
        "max_batch_requests": limits.get("max_num_seqs"),
        "max_client_batch_size": MAX_INPUTS,
        "auto_truncate": card.get("overflow") == "truncate",
        # Each worker tokenizes its own requests (on its event loop, or one helper thread
        # for long inputs): one tokenizer per ready replica.
        "tokenization_workers": ready_replicas,
        "version": version,
        "sha": None,
        "docker_label": None,
    }


def _model_type(card: dict[str, Any]) -> dict[str, Any]:
    """TEI's model_type: a classifier head with one output is a reranker."""
    labels = card.get("head_labels")
    if labels:
        id2label = {str(i): label for i, label in enumerate(labels)}
        label2id = {label: i for i, label in enumerate(labels)}
        # TEI has no token-classification type; a token head is a classifier (of tokens).
        reranker = len(labels) == 1 and card.get("head_task") != "token"
        kind = "reranker" if reranker else "classifier"
        return {kind: {"id2label": id2label, "label2id": label2id}}
    modes = card.get("pooling") or []
    pooling = "+".join(_POOLING_NAMES.get(mode, mode) for mode in modes) or None
    return {"embedding": {"pooling": pooling}}
