"""sr.errors draws every exception class sr defines: a class is defined in sr.errors, or
its dotted path (`sr.pool.state.IllegalTransition`) is named in the module docstring's tree.
And every dotted path the tree names is a class that exists."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import sr
import sr.errors

# a dotted path in the tree: sr.pool.state.IllegalTransition
_DOTTED = re.compile(r"\b(sr(?:\.[A-Za-z_][A-Za-z0-9_]*)+)\b")


def _sr_modules() -> list:
    modules = []
    for info in pkgutil.walk_packages(sr.__path__, prefix="sr."):
        if info.name.endswith("__main__"):
            continue
        modules.append(importlib.import_module(info.name))
    return modules


def _exception_classes() -> dict[str, type]:
    found = {}
    for module in _sr_modules():
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
            ):
                found[f"{module.__name__}.{name}"] = value
    return found


def test_every_exception_class_of_sr_is_in_the_taxonomy():
    tree = sr.errors.__doc__ or ""
    named = set(_DOTTED.findall(tree))
    classes = _exception_classes()
    assert "sr.errors.SrError" in classes and "sr.pool.state.IllegalTransition" in classes
    missing = sorted(
        path for path in classes if not path.startswith("sr.errors.") and path not in named
    )
    assert missing == [], "define these in sr.errors or name them in its tree"
    # the tree names every class sr.errors defines, too
    undrawn = sorted(
        path.rsplit(".", 1)[1]
        for path in classes
        if path.startswith("sr.errors.") and not re.search(rf"\b{path.rsplit('.', 1)[1]}\b", tree)
    )
    assert undrawn == []


def test_every_class_the_tree_names_exists():
    tree = sr.errors.__doc__ or ""
    classes = _exception_classes()
    stale = sorted(
        path
        for path in set(_DOTTED.findall(tree))
        if path[len(path.rsplit(".", 1)[0]) + 1 :][:1].isupper() and path not in classes
    )
    assert stale == []
