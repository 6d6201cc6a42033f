"""Checks raw YAML data against the attrs schema before cattrs structures it.

cattrs stops at the first problem and coerces loosely (`int("5")`, `bool("no")`), so this
walker runs first: it reports every unknown key (with the closest known key), every wrong
type and every missing required key, each with its dotted path, and returns a cleaned copy
(bad values replaced by their defaults) that cattrs can always structure. That copy lets
semantic validation run too, so one pass reports every kind of error.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

import attrs

from sr.config.schema import yaml_key
from sr.errors import ConfigIssue

_TYPE_WORDS = {str: "a string", int: "an integer", bool: "true or false", float: "a number"}


def describe(value: Any) -> str:
    """How a wrong value reads in an error message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"string {value!r}"
    return f"{type(value).__name__} {value!r}"


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _placeholder(tp: Any) -> Any:
    """A value of the right type for a required field that was missing or wrong."""
    if attrs.has(tp):
        return _check_class({}, tp, "", [])
    return {str: "", int: 0, bool: False}.get(tp)


def check(value: Any, tp: Any, path: str, issues: list[ConfigIssue]) -> Any:
    """Append the problems of `value` (expected type `tp`) to `issues`; return it cleaned.

    A value that cannot be used is returned as `_MISSING` so the caller falls back to
    the field default.
    """
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return check(value, args[0], path, issues)
    if attrs.has(tp):
        return _check_class(value, tp, path, issues)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            issues.append(ConfigIssue(path, f"expected a list, got {describe(value)}"))
            return _MISSING
        # A bad item becomes a placeholder, not a gap, so later indices keep their paths.
        cleaned = [check(v, item_tp, f"{path}[{i}]", issues) for i, v in enumerate(value)]
        return [_placeholder(item_tp) if c is _MISSING else c for c in cleaned]
    if origin is dict:
        _key_tp, item_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            issues.append(ConfigIssue(path, f"expected a mapping, got {describe(value)}"))
            return _MISSING
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                issues.append(ConfigIssue(path, f"keys must be strings, got {describe(k)}"))
                continue
            c = check(v, item_tp, join(path, k), issues)
            out[k] = _placeholder(item_tp) if c is _MISSING else c
        return out
    # YAML gives bool for true/false, and bool is an int subclass: exclude it explicitly.
    ok = isinstance(value, tp) and not (tp is int and isinstance(value, bool))
    if not ok:
        hint = ""
        if tp is str and isinstance(value, int | float) and not isinstance(value, bool):
            hint = " (quote it to make it a string)"
        issues.append(
            ConfigIssue(path, f"expected {_TYPE_WORDS.get(tp, tp)}, got {describe(value)}{hint}")
        )
        return _MISSING
    return value


_MISSING = object()


def _check_class(value: Any, cls: type, path: str, issues: list[ConfigIssue]) -> Any:
    if not isinstance(value, dict):
        issues.append(ConfigIssue(path, f"expected a mapping, got {describe(value)}"))
        return _MISSING
    hints = typing.get_type_hints(cls)
    fields = {yaml_key(f): f for f in attrs.fields(cls)}
    out: dict[str, Any] = {}
    for key, item in value.items():
        if not isinstance(key, str) or key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.6)
            hint = (
                f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(fields)}"
            )
            issues.append(ConfigIssue(join(path, str(key)), f"unknown key{hint}"))
            continue
        cleaned = check(item, hints[fields[key].name], join(path, key), issues)
        if cleaned is not _MISSING:
            out[key] = cleaned
    for key, field in fields.items():
        if key in out or field.default is not attrs.NOTHING:
            continue
        if key not in value:
            issues.append(ConfigIssue(join(path, key), "missing required key"))
        out[key] = _placeholder(hints[field.name])
    return out


def check_document(data: Any, cls: type) -> tuple[Any, list[ConfigIssue]]:
    """Check a whole document; returns (cleaned data, issues)."""
    issues: list[ConfigIssue] = []
    if data is None:
        return {}, [ConfigIssue("", "the config is empty; expected a mapping with 'global'")]
    cleaned = _check_class(data, cls, "", issues)
    if cleaned is _MISSING:
        issues[-1] = ConfigIssue("", f"the config must be a mapping, got {describe(data)}")
        cleaned = {}
    return cleaned, issues
