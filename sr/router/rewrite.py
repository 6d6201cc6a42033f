"""The `model` field on its way through the router, as bytes.

Callers name a deployment or its artifact; a worker knows only its artifact (the pool's
card check ties the deployment to it) and names in its answer what the request named. So
the translation is the router's alone, and it is one operation, `rename_model`, at the two
crossings: the request goes out naming the artifact, the answer comes back naming what
the caller named. A caller who names the artifact has its bytes forwarded and its answer
passed back untouched.

How the member is found without parsing (the router parses a request once, to check
`model`; it never parses an answer, nor dumps a request again, unless these rules leave a
doubt). Inside a JSON string every `"` is escaped, so the bytes `"model"` followed by `:`
are always an object member's name.
- A request (anyone's bytes): `"model"` occurs exactly once and no `\\u` escape appears
  (one could spell the name, `"mod\\u0065l"`, or hold a lone surrogate the router must
  refuse), so that member is the top-level one. A full scan, over a body that is small.
- An answer (a worker's dump of a dict: no repeated key, and `model` among its first
  members): the first `"model"`, when nothing before it but the object's own `{` opens a
  value, is a top-level member. A scan of the answer's head only: answers are long.
- Otherwise (a label named `model` in a request, an escaped text, a value spelled with
  other escapes, a worker of another shape) the slow path parses, sets and dumps
  compactly; for sr's compact answers that gives the very bytes the splice would.
"""

from __future__ import annotations

import json
import re
from typing import Any

from sr.errors import InvalidRequest
from sr.http.jsonbody import dump_json, parse_json_object

_MODEL_KEY = b'"model"'


def parse_native_body(raw: bytes) -> tuple[dict[str, Any], str]:
    """The JSON object body and its `model`; InvalidRequest naming what is wrong."""
    body = parse_json_object(raw)
    model = body.get("model")
    if model is None:
        raise InvalidRequest("model: field is required")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model: must be a non-empty string")
    return body, model


def forward_native(raw: bytes, body: dict[str, Any], model: str, artifact: str) -> bytes:
    """What the worker gets for a native request: the caller's bytes naming the artifact."""
    match = _only_member(raw, model)
    if match is None:
        return with_model(body, artifact)
    return raw if model == artifact else rename_model(raw, match, artifact)


def with_model(body: dict[str, Any], artifact: str) -> bytes:
    """`body` dumped compactly with `model` set to `artifact` (a body the router built, or
    the slow path of `forward_native`). The caller's dict is not changed."""
    return dump_json({**body, "model": artifact})


def answer_with_public_model(answer: bytes, artifact: str, public: str) -> bytes:
    """The worker's answer with its top-level `model` renamed from `artifact` to `public`."""
    if public == artifact:
        return answer
    match = _leading_member(answer, artifact)
    if match is not None:
        return rename_model(answer, match, public)
    try:
        parsed = json.loads(answer)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return answer
    if isinstance(parsed, dict) and parsed.get("model") == artifact:
        parsed["model"] = public
        return json.dumps(parsed, separators=(",", ":"), ensure_ascii=False).encode()
    return answer


def rename_model(raw: bytes, member: re.Match[bytes], name: str) -> bytes:
    """The one rename: `raw` with the `model` member found by the rules now naming `name`."""
    return b"".join((raw[: member.start()], b'"model":', _encoded(name), raw[member.end() :]))


def _only_member(raw: bytes, name: str) -> re.Match[bytes] | None:
    """The `model` member naming `name` in a request, by the request rule."""
    if raw.count(_MODEL_KEY) != 1 or b"\\u" in raw:
        return None
    return _member_pattern(name).match(raw, raw.find(_MODEL_KEY))


def _leading_member(raw: bytes, name: str) -> re.Match[bytes] | None:
    """The `model` member naming `name` in an answer, by the answer rule."""
    at = raw.find(_MODEL_KEY)
    if at < 0:
        return None
    head = raw[:at]
    if head.count(b"{") != 1 or b"[" in head:
        return None
    return _member_pattern(name).match(raw, at)


def _encoded(name: str) -> bytes:
    return json.dumps(name, ensure_ascii=False).encode()


_patterns: dict[str, re.Pattern[bytes]] = {}


def _member_pattern(name: str) -> re.Pattern[bytes]:
    """`"model"`, a colon and `name` as a JSON string, with any white space between."""
    pattern = _patterns.get(name)
    if pattern is None:
        pattern = re.compile(_MODEL_KEY + rb"\s*:\s*" + re.escape(_encoded(name)))
        if len(_patterns) < 1024:  # names come from the config and callers who got a 200
            _patterns[name] = pattern
    return pattern
