"""Reading a worker's error answer: the one reader of `{"error": {"message", "code", ...}}`.

`RequestError.body` (sr.errors) writes that shape; the pool (a failed replica's reason),
the Python API (sr.api.codec: the error class to raise), the TEI front (the error in TEI's
shape) and the fault route (a worker that refused a fault) read it here. Rules:
- `message` is `error.message` as text; a body of another shape (an attached worker of
  another kind, a proxy's page) is its own first 200 characters, decoded leniently, and an
  empty body is "(empty body)": never raw JSON cut short when the shape is sr's, never "".
- `code` and `param` are given only when the body holds them as strings.
Pure: never raises.
"""

from __future__ import annotations

import json

import attrs

MAX_RAW_CHARS = 200


@attrs.frozen
class ErrorAnswer:
    message: str
    code: str | None = None
    param: str | None = None


def read_error_answer(body: bytes) -> ErrorAnswer:
    try:
        error = json.loads(body)["error"]
        message = error["message"]
    except (ValueError, KeyError, TypeError, RecursionError):
        # ValueError covers UnicodeDecodeError and JSONDecodeError; TypeError a non-dict
        return ErrorAnswer(body[:MAX_RAW_CHARS].decode("utf-8", "replace") or "(empty body)")
    code, param = error.get("code"), error.get("param")
    return ErrorAnswer(
        str(message),
        code if isinstance(code, str) else None,
        param if isinstance(param, str) else None,
    )
