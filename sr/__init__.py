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
    "Classification": "sr.api.results",
    "Classifications": "sr.api.results",
    "Decision": "sr.api.results",
    "Decisions": "sr.api.results",
    "Embeddings": "sr.api.results",
    "Question": "sr.api.results",
    "RerankResult": "sr.api.results",
    "Reranking": "sr.api.results",
    "Usage": "sr.api.results",
}
# Spelt out, not built from _LAZY: type checkers read __all__ to know what sr re-exports.
__all__ = [  # noqa: F405 (the result classes come from a star import, below)
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
    from sr.api.results import *  # noqa: F403 (the result classes: its __all__)
    from sr.pool.supervisor import Supervisor, open_router
    from sr.router.serve import ServingRouter, serve
else:
    # Hidden from type checkers: a module __getattr__ would make every misspelt name
    # (`sr.open_routr`) type-check as a valid attribute.
    from sr.lazy_names import names_from as _names_from

    __getattr__ = _names_from(__name__, _LAZY, globals())
