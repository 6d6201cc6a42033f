"""Request-body checks shared by the worker tasks. Every error names the offending field.

Size caps are 413 `request_too_large`; everything else malformed is 400 `invalid_request`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Any

from sr.errors import InvalidRequest, RequestTooLarge
from sr.http.jsonbody import json_kind, parse_json_object
from sr.http.limits import MAX_BODY_BYTES

MAX_INPUTS = 2048
MAX_INPUT_CHARS = 100_000
MAX_LABELS = 256
MAX_QUESTIONS = 64
MAX_CRITERIA = 256
# In the message of an input over input.max_tokens that may not be cut (TEI's routes answer
# it with 413, as TEI does).
TOO_MANY_TOKENS = "exceed input.max_tokens"


def parse_object(body: bytes) -> dict[str, Any]:
    if len(body) > MAX_BODY_BYTES:
        raise RequestTooLarge(f"request body is {len(body)} bytes; the limit is {MAX_BODY_BYTES}")
    return parse_json_object(body)


def check_fields(
    obj: dict,
    *,
    allowed: Collection[str],
    required: Iterable[str] = (),
    where: str = "",
    route: str = "",
) -> None:
    """Unknown fields refused (a misspelt `normalise` must not silently serve the default),
    required ones present. `where` prefixes nested fields' names (`input[0].`); `route`,
    when given, is named in the message (`top_k: unknown field for /rerank`)."""
    for name in obj:
        if name not in allowed:
            for_route = f" for {route}" if route else ""
            raise InvalidRequest(
                f"{where}{name}: unknown field{for_route}; allowed: {', '.join(sorted(allowed))}"
            )
    for name in required:
        if name not in obj:
            raise InvalidRequest(f"{where}{name}: required field is missing")


def optional_model(obj: dict) -> str | None:
    model = obj.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise InvalidRequest(f"model: expected a non-empty string, got {json_kind(model)}")
    return model


def text(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"{field}: expected a string, got {json_kind(value)}")
    if not value.strip():
        raise InvalidRequest(f"{field}: must not be empty")
    if len(value) > MAX_INPUT_CHARS:
        raise RequestTooLarge(f"{field}: {len(value)} characters; the limit is {MAX_INPUT_CHARS}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # JSON "\ud800" escapes decode to lone surrogates
            raise InvalidRequest(f"{field}: contains an unpaired UTF-16 surrogate") from None
    return value


def inputs(value: Any) -> tuple[list[str], list[str]]:
    """`input`: a string or a non-empty list of strings -> (texts, field names)."""
    if isinstance(value, str):
        return [text(value, "input")], ["input"]
    return text_list(value, "input")


def text_list(value: Any, field: str) -> tuple[list[str], list[str]]:
    """A non-empty list of at most MAX_INPUTS strings -> (texts, field names `field[i]`)."""
    if not isinstance(value, list):
        expected = "a string or a list of strings" if field == "input" else "a list of strings"
        raise InvalidRequest(f"{field}: expected {expected}, got {json_kind(value)}")
    if not value:
        raise InvalidRequest(f"{field}: must not be an empty list")
    if len(value) > MAX_INPUTS:
        raise RequestTooLarge(f"{field}: {len(value)} items; the limit is {MAX_INPUTS} per request")
    fields = [f"{field}[{i}]" for i in range(len(value))]
    return [text(item, where) for item, where in zip(value, fields, strict=True)], fields


def embedding_inputs(value: Any, vocab: Callable[[], int]) -> tuple[str, list, list[str]]:
    """`input` of /v1/embeddings, as OpenAI takes it: a string, a list of strings, one text
    as token ids (`[int, ...]`) or several (`[[int, ...], ...]`).

    -> ("text", texts, fields) or ("ids", id lists, fields). A list is token ids when its
    first item is an integer or a list; every id must lie in [0, vocab()) (asked only for
    token ids)."""
    if not isinstance(value, list) or not value:
        texts, fields = inputs(value)
        return "text", texts, fields
    first = value[0]
    if _is_int(first):
        return "ids", [token_ids(value, "input", vocab(), item="input")], ["input"]
    if not isinstance(first, list):
        texts, fields = text_list(value, "input")
        return "text", texts, fields
    if len(value) > MAX_INPUTS:
        raise RequestTooLarge(f"input: {len(value)} items; the limit is {MAX_INPUTS} per request")
    fields = [f"input[{i}]" for i in range(len(value))]
    vocab_size = vocab()
    rows = []
    for row, field in zip(value, fields, strict=True):
        if not isinstance(row, list):
            raise InvalidRequest(f"{field}: expected a list of token ids, got {json_kind(row)}")
        rows.append(token_ids(row, field, vocab_size, item=field))
    return "ids", rows, fields


def token_ids(value: list, field: str, vocab_size: int, *, item: str) -> list[int]:
    """A non-empty list of token ids, each in [0, vocab_size); errors name `item[j]`."""
    if not value:
        raise InvalidRequest(f"{field}: must not be an empty list of token ids")
    if len(value) > MAX_INPUT_CHARS:
        raise RequestTooLarge(f"{field}: {len(value)} token ids; the limit is {MAX_INPUT_CHARS}")
    for j, token in enumerate(value):
        if not _is_int(token):
            raise InvalidRequest(
                f"{item}[{j}]: expected a token id (integer), got {json_kind(token)}"
            )
        if not 0 <= token < vocab_size:
            raise InvalidRequest(
                f"{item}[{j}]: token id {token} is outside the vocabulary [0, {vocab_size})"
            )
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{field}: expected an integer >= 1, got {json_kind(value)}")
    if value < 1:
        raise InvalidRequest(f"{field}: expected an integer >= 1, got {value}")
    return value


def boolean(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest(f"{field}: expected true or false, got {json_kind(value)}")
    return value


def text_map(value: Any, field: str, *, limit: int) -> dict[str, str]:
    """A non-empty {key: description} object with non-empty string values. A key is any
    string, the empty one too: it only names its entry in the answer, and an OpenAPI 3.0
    schema cannot constrain an object's keys, so refusing one would refuse bodies the
    served document allows."""
    if not isinstance(value, dict):
        raise InvalidRequest(
            f"{field}: expected an object of key -> description, got {json_kind(value)}"
        )
    if not value:
        raise InvalidRequest(f"{field}: must not be empty")
    if len(value) > limit:
        raise RequestTooLarge(f"{field}: {len(value)} entries; the limit is {limit}")
    return {key: text(description, f"{field}.{key}") for key, description in value.items()}


def text_pairs(value: list, field: str) -> tuple[list[tuple[str, str]], list[str]]:
    """A non-empty list of at most MAX_INPUTS [text, text_pair] lists."""
    if len(value) > MAX_INPUTS:
        raise RequestTooLarge(f"{field}: {len(value)} items; the limit is {MAX_INPUTS} per request")
    pairs, fields = [], []
    for index, pair in enumerate(value):
        where = f"{field}[{index}]"
        if not isinstance(pair, list) or len(pair) != 2:
            raise InvalidRequest(
                f"{where}: expected a pair [text, text_pair], got {json_kind(pair)} "
                "(a batch is all texts or all pairs)"
            )
        pairs.append((text(pair[0], f"{where}[0]"), text(pair[1], f"{where}[1]")))
        fields.append(where)
    return pairs, fields


def rank_field(value: Any) -> str:
    """Cohere's `rank_fields`: the one field of a document object that is ranked (`text`
    when absent). sr ranks one text per document, so several fields are refused."""
    if value is None:
        return "text"
    if not isinstance(value, list) or len(value) != 1 or not isinstance(value[0], str):
        raise InvalidRequest(
            "rank_fields: expected a list of one field name; sr ranks one text per document"
        )
    return value[0]


def documents(value: Any, field_name: str) -> tuple[list[str], list[str]]:
    """Rerank `documents`: strings, or objects whose `field_name` (`text` unless
    rank_fields names another) is the text, as Cohere's and Jina's APIs take them. A
    string document has no other field, so naming one is refused, as an object lacking
    it is."""
    if field_name != "text" and isinstance(value, list):
        for index, document in enumerate(value):
            if isinstance(document, str):
                raise InvalidRequest(
                    f"rank_fields: names {field_name!r}, a field of document objects; "
                    f"documents[{index}] is a string (its text is ranked as `text`)"
                )
    if not isinstance(value, list) or not value or not any(isinstance(d, dict) for d in value):
        return text_list(value, "documents")
    if len(value) > MAX_INPUTS:
        raise RequestTooLarge(
            f"documents: {len(value)} items; the limit is {MAX_INPUTS} per request"
        )
    texts, fields = [], []
    for index, document in enumerate(value):
        where = f"documents[{index}]"
        if isinstance(document, dict):
            if field_name not in document:
                raise InvalidRequest(f"{where}.{field_name}: required field is missing")
            texts.append(text(document[field_name], f"{where}.{field_name}"))
        else:
            texts.append(text(document, where))
        fields.append(where)
    return texts, fields
