"""Parsing a request body as one JSON object, the same way in the router and the worker.

Every way a body can be bad ends as `InvalidRequest` (400) naming the body, never as an
exception that would become a 500: not UTF-8 (decoded explicitly, since `json.loads(bytes)`
would also guess UTF-16/32), not JSON, nested too deeply, an integer too long to convert,
or a string holding a lone surrogate (valid JSON, but no text can carry it onwards).
"""

from __future__ import annotations

import json
from typing import Any

from sr.errors import InvalidRequest


def parse_json_object(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise InvalidRequest("body: not valid UTF-8") from None
    except json.JSONDecodeError as error:
        raise InvalidRequest(f"body: not valid JSON ({error.msg} at char {error.pos})") from None
    except RecursionError:
        raise InvalidRequest("body: JSON nested too deeply") from None
    except ValueError as error:  # e.g. an integer over the interpreter's digit limit
        raise InvalidRequest(f"body: {error}") from None
    if not isinstance(value, dict):
        raise InvalidRequest(f"body: expected a JSON object, got {json_kind(value)}")
    return value


# Compact JSON text as the worker writes its answers: one encoder object, built once (a
# `json.dumps` call with options builds a new one each time).
compact_json = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, check_circular=False
).encode


def dump_json(value: Any) -> bytes:
    """Compact UTF-8 JSON; a lone surrogate in any string is the caller's InvalidRequest."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise InvalidRequest("body: a string holds a lone surrogate (not valid text)") from None


def json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
