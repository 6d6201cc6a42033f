"""Package faces that import their names on first use (`sr`, `sr.pool`).

A package whose names live in heavy modules (trio, torch, the pool) keeps `import sr` and
the fork server's `import sr.pool.forkserver` cheap by resolving them on first access
instead: `__getattr__ = names_from(__name__, TABLE, globals())`, where TABLE maps each name
to the module that defines it. The value is kept in the package's namespace, so a name is
imported once.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def names_from(
    package: str, table: Mapping[str, str], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` resolving the names of `table`."""

    def __getattr__(name: str) -> Any:
        module_name = table.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module_name), name)
        namespace[name] = value
        return value

    return __getattr__
