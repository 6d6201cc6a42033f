"""Reading the fields of TEI's request bodies: each check names the field in TEI's words.
Pure; shared by sr.router.tei (the routes) and sr.router.tei_tasks (the task bodies)."""

from __future__ import annotations

from typing import Any

from sr.errors import EmptyInput, InvalidRequest
from sr.http.jsonbody import json_kind


def text(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"{field}: expected a string, got {json_kind(value)}")
    if not value:
        raise EmptyInput(f"{field}: must not be empty")
    return value  # the worker checks the rest (length, lone surrogates)


def texts(inputs: Any, field: str = "inputs") -> str | list[str]:
    """`inputs` as one text or a non-empty list of texts."""
    if isinstance(inputs, str):
        return text(inputs, field)
    if isinstance(inputs, list):
        if not inputs:
            raise EmptyInput(f"{field}: must not be empty")
        return [text(item, f"{field}[{i}]") for i, item in enumerate(inputs)]
    raise InvalidRequest(
        f"{field}: expected a string or a list of strings, got {json_kind(inputs)}"
    )


def flag(body: dict[str, Any], field: str, default: bool) -> bool:
    value = body.get(field, default)
    if not isinstance(value, bool):
        raise InvalidRequest(f"{field}: expected true or false, got {json_kind(value)}")
    return value


def truncation(body: dict[str, Any]) -> dict[str, Any]:
    """The native `truncate` (absent or null: the deployment's input.overflow) and
    `truncation_direction` ("left" keeps a text's end; "right", the default, its start)."""
    native: dict[str, Any] = {}
    direction = body.get("truncation_direction")
    if direction in ("left", "Left"):
        native["truncation_direction"] = "left"
    elif direction not in (None, "right", "Right"):
        raise InvalidRequest(f"truncation_direction: expected 'right' or 'left', got {direction!r}")
    truncate = body.get("truncate")
    if truncate is not None:
        if not isinstance(truncate, bool):
            raise InvalidRequest(
                f"truncate: expected true, false or null, got {json_kind(truncate)}"
            )
        native["truncate"] = truncate
    return native


def prompt(body: dict[str, Any]) -> dict[str, Any]:
    """The native `prompt_name` (the worker checks it against the folder's prompts)."""
    name = body.get("prompt_name")
    return {} if name is None else {"prompt_name": name}


def refuse_prompt(body: dict[str, Any]) -> None:
    """Where prompts do not apply (/tokenize: its tokens are the text's as sent)."""
    if body.get("prompt_name") is not None:
        raise InvalidRequest(
            "prompt_name: not supported on /tokenize; sr tokenizes each text as sent (the "
            "prompts apply on /embed, /embed_sparse, /embed_all and /similarity): put the "
            "prompt in the text"
        )


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
