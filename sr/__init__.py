"""sr: a Trio router that serves small encoder models as pools of worker processes.

`sr.open_router(config)` (the pool, embedded in a Trio program; docs/python-api.md),
`sr.serve(config)` (the HTTP front end) and the typed result classes are imported on first
use, so `import sr` stays cheap (no torch, no trio). Type checkers see them as ordinary
imports: the `TYPE_CHECKING` block below, which never runs, names the same objects as the
`_LAZY` table, which is what runs; a test keeps the two in step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"

_LAZY = {
    "open_router": "sr.pool.supervisor",
    "Supervisor": "sr.pool.supervisor",
    "serve": "sr.router.serve",
    "ServingRouter": "sr.router.serve",
    "Classification": "sr.api",
    "Classifications": "sr.api",
    "Decision": "sr.api",
    "Decisions": "sr.api",
    "Embeddings": "sr.api",
    "Question": "sr.api",
    "RerankResult": "sr.api",
    "Reranking": "sr.api",
    "Usage": "sr.api",
}
# Spelt out, not built from _LAZY: type checkers read __all__ to know what sr re-exports.
__all__ = [
    "Classification",
    "Classifications",
    "Decision",
    "Decisions",
    "Embeddings",
    "Question",
    "RerankResult",
    "Reranking",
    "ServingRouter",
    "Supervisor",
    "Usage",
    "__version__",
    "open_router",
    "serve",
]

if TYPE_CHECKING:
    from sr.api import (
        Classification,
        Classifications,
        Decision,
        Decisions,
        Embeddings,
        Question,
        Reranking,
        RerankResult,
        Usage,
    )
    from sr.pool.supervisor import Supervisor, open_router
    from sr.router.serve import ServingRouter, serve
else:
    # Hidden from type checkers: a module __getattr__ would make every misspelt name
    # (`sr.open_routr`) type-check as a valid attribute.
    from sr.lazy_names import names_from as _names_from

    __getattr__ = _names_from(__name__, _LAZY, globals())
