"""Which prompt a request's texts get, as sentence-transformers' `encode(prompt_name=...)`
picks it (sr.models.prompts): the `prompt_name` named, else the prompt Jina's `task` names
when the folder has one of that name, else the folder's `default_prompt_name`, else none.

`task` is Jina's field (`retrieval.query`, `text-matching`, ...): a folder made for Jina's
tasks lists them as prompts; any other folder serves the task as if none were named, so a
Jina client is served by every embedder. Naming both `prompt_name` and `task` is refused
(one of them would be ignored).

Token-id input is embedded as given: it takes no prompt (naming one is refused), and the
default prompt is not applied to it.
"""

from __future__ import annotations

from typing import Any

from sr.errors import InvalidRequest
from sr.http.jsonbody import json_kind

PROMPT_FIELDS = frozenset({"prompt_name", "task"})


def named_prompt(body: dict[str, Any], prompts) -> str | None:
    """The prompt name the request asks for (checked against the folder's `prompts`), or
    None when it names none (the default then applies)."""
    name = body.get("prompt_name")
    task = body.get("task")
    if name is not None and task is not None:
        raise InvalidRequest("task: give prompt_name or task, not both")
    if name is not None:
        if not isinstance(name, str):
            raise InvalidRequest(f"prompt_name: expected a string, got {json_kind(name)}")
        if name not in prompts.texts:
            raise InvalidRequest(
                f"prompt_name: unknown prompt {name!r}; this model's prompts: "
                f"{', '.join(sorted(prompts.texts))}"
            )
        return name
    if task is not None:
        if not isinstance(task, str):
            raise InvalidRequest(f"task: expected a string, got {json_kind(task)}")
        return task if task in prompts.texts else None
    return None


def prompt_text(body: dict[str, Any], prompts, *, token_ids: bool = False) -> str:
    """The text prepended to each of the request's texts ("" for none)."""
    name = named_prompt(body, prompts)
    if token_ids:
        if body.get("prompt_name") is not None:
            raise InvalidRequest(
                "prompt_name: applies to text input only; token ids are embedded as given"
            )
        return ""
    return prompts.text_of(name)


def prompt_length(tokenizer, prompt: str) -> int:
    """The tokens of `prompt` at the start of a prompted row: the prompt tokenized alone,
    without its closing special token (sentence-transformers' `prompt_length`)."""
    encoding = tokenizer.encode(prompt)
    length = len(encoding.ids)
    if length and encoding.special_tokens_mask[-1]:
        length -= 1
    return length
