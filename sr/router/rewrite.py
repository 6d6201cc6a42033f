"""The `model` field on its way through the router.

Callers name a deployment or its artifact; workers know only their artifact. The router
parses the request once, checks `model`, and forwards the body with `model` set to the
artifact. The answer's top-level `model` goes back as the name the caller used.
"""

from __future__ import annotations

import json
import re
from typing import Any

from sr.errors import InvalidRequest
from sr.http.jsonbody import dump_json, parse_json_object


def parse_native_body(raw: bytes) -> tuple[dict[str, Any], str]:
    """The JSON object body and its `model`; InvalidRequest naming what is wrong."""
    body = parse_json_object(raw)
    model = body.get("model")
    if model is None:
        raise InvalidRequest("model: field is required")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model: must be a non-empty string")
    return body, model


def forward_body(body: dict[str, Any], artifact: str) -> bytes:
    body = dict(body)
    body["model"] = artifact
    return dump_json(body)


def answer_with_public_model(answer: bytes, artifact: str, public: str) -> bytes:
    """The worker's answer with its top-level `model` renamed from `artifact` to `public`.

    Fast path: inside JSON strings every quote is escaped, so the bytes `"model":` followed
    by the encoded artifact can only be an object member; if it occurs exactly once it is
    the top-level one (answers carry no nested `model` naming the artifact) and is replaced
    in place. Anything else takes the slow path: parse, set, dump.
    """
    if public == artifact:
        return answer
    pattern = _member_pattern(artifact)
    matches = pattern.findall(answer)
    if len(matches) == 1:
        replacement = b'"model":' + json.dumps(public, ensure_ascii=False).encode()
        return pattern.sub(lambda _m: replacement, answer, count=1)
    try:
        parsed = json.loads(answer)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return answer
    if isinstance(parsed, dict) and parsed.get("model") == artifact:
        parsed["model"] = public
        return json.dumps(parsed, separators=(",", ":"), ensure_ascii=False).encode()
    return answer


_patterns: dict[str, re.Pattern[bytes]] = {}


def _member_pattern(artifact: str) -> re.Pattern[bytes]:
    pattern = _patterns.get(artifact)
    if pattern is None:
        encoded = json.dumps(artifact, ensure_ascii=False).encode()
        pattern = re.compile(rb'"model"\s*:\s*' + re.escape(encoded))
        if len(_patterns) < 1024:  # artifacts come from the config: few and stable
            _patterns[artifact] = pattern
    return pattern
